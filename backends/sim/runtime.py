"""The twin's runtime: one :class:`Twin` (engine + wall clock + requests in flight) that the routes call into.

Time: engine seconds run ``time_scale`` times as fast as wall seconds would (engine second =
``time_scale`` wall seconds), from the moment the app starts. One asyncio task drives the engine:
it sleeps until the wall time of ``next_time()``, applies every pass due by then and wakes the
handlers. Every duration the twin *reports* (metrics, ``meta_info.e2e_latency``, throughput) is in
engine seconds, so a time-scaled twin reports the latencies of the hardware it simulates.

Disconnect: ``abort_delay_s`` wall seconds (default 2.0, SGLang's value, not time-scaled) after a
streaming response ends or its client goes, the request is aborted (a no-op when finished); a
request still waiting for its first token or a non-streaming one checks the connection every
``2 × abort_delay_s`` (SGLang's 4 s). An aborted request frees its KV; its prefix stays cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from backends.sim.engine import EngineEvent, EngineRequest, RankLoad
from backends.sim.metrics import SchedulerSnapshot, TwinMetrics
from backends.sim.tokenizer import count_tokens, text_blocks

log = logging.getLogger("cachegate.twin")

SGLANG_VERSION = "0.5.23"
DEFAULT_MODEL = "moonshotai/Kimi-K2-Instruct"
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
MAX_MODEL_LEN = 262_144
"""Kimi K2-0905 / K2-Thinking / K2.5's context window: what every profile serves (``max_model_len``)."""


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message, self.status, self.err_type = message, status, err_type


@dataclass(eq=False)
class Live:
    """One request in flight, as the HTTP layer sees it."""

    rid: str
    prompt_tokens: int
    output_tokens: int
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]] | None
    stream: bool
    arrival: float  # engine seconds
    first: asyncio.Future[EngineEvent]
    done: asyncio.Future[EngineEvent]
    first_time: float | None = None
    cached_tokens: int = 0
    sent: int = 0  # output tokens already sent to the client

    @property
    def reasoning_tokens(self) -> int:
        return count_tokens(self.reasoning)


@dataclass
class Plan:
    """What a request will produce, decided up front from its body (deterministic)."""

    prompt_text: str
    prompt_tokens: int
    output_tokens: int
    max_new_tokens: int
    reasoning: str
    content: str
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str
    final_text: str
    dp_rank: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def seed_key(*parts: object) -> str:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


class Twin:
    """Engine + wall clock + request registry; the routes call into it."""

    def __init__(
        self,
        engine: Any,
        *,
        profile: Any,
        model: str,
        time_scale: float,
        cache_report: bool,
        abort_delay_s: float,
        stream_interval_s: float,
        reasoning: bool,
        startup_delay_s: float,
        answer_scale: float = 1.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.engine = engine
        self.profile = profile
        self.model = model
        self.time_scale = time_scale
        self.cache_report = cache_report
        self.abort_delay_s = abort_delay_s
        self.stream_interval_s = stream_interval_s
        self.reasoning = reasoning
        self.startup_delay_s = startup_delay_s
        self.answer_scale = answer_scale
        self.live: dict[str, Live] = {}
        self.max_live = 0
        """Most requests in the twin at once (tests count concurrency at the backend with it)."""
        self.traceparents: OrderedDict[str, dict[str, str | None]] = OrderedDict()
        self.requests: deque[dict[str, Any]] = deque(maxlen=512)
        """The last requests seen (method, path, query, client headers, status; what each generation
        decided): ``GET /_twin/requests``, for tests and for seeing what a client sends."""
        self.last_trace: dict[str, str | None] = {"rid": None, "traceparent": None, "tracestate": None}
        self.ready = False
        self.failed: Exception | None = None
        self.startup_time = time.time()
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self.metrics: Any = TwinMetrics(model, self._snapshot)
        self.dialect = "sglang"
        """The engine whose HTTP API the twin speaks (``sglang`` or ``vllm``; ``server.create_app`` sets it)."""
        self.events: Any = None
        """``backends.sim.kv_publisher.TwinEvents`` when started with a zmq ``kv_events_config``."""

    # ---- clock and driver -------------------------------------------------------------------
    def now(self) -> float:
        assert self._loop is not None
        return (self._loop.time() - self._t0) / self.time_scale

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._wake = asyncio.Event()
        self._driver = asyncio.create_task(self._drive(), name="twin-driver")
        if self.startup_delay_s > 0:
            self._loop.call_later(self.startup_delay_s, self._set_ready)
        else:
            self.ready = True

    def _set_ready(self) -> None:
        self.ready = self.failed is None

    async def stop(self) -> None:
        for t in self._timers:
            t.cancel()
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver
        if self.events is not None:
            self.events.flush()
            self.events.shutdown()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _drive(self) -> None:
        try:
            await self._drive_loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine bug: fail loudly and report unhealthy, never hang silently
            log.exception("twin engine driver failed")
            self.failed = exc
            self.ready = False
            for live in list(self.live.values()):
                for fut in (live.first, live.done):
                    if not fut.done():
                        fut.set_exception(RuntimeError(f"engine failed: {exc!r}"))

    async def _drive_loop(self) -> None:
        assert self._wake is not None and self._loop is not None
        while True:
            self._catch_up()
            nt = self.engine.next_time()
            self._wake.clear()
            if nt is None:
                await self._wake.wait()
                continue
            delay = self._t0 + nt * self.time_scale - self._loop.time()
            if delay > 0:
                try:  # asyncio.timeout: 3.11's wait_for swallows a cancel that meets a wake-up
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                    continue
                except TimeoutError:
                    pass
            # The pass is due: apply it even if the timer fired a hair early.
            self._dispatch(self.engine.advance(max(self.now(), nt)))

    def _catch_up(self) -> float:
        now = self.now()
        self._dispatch(self.engine.advance(now))
        return now

    def _dispatch(self, events: list[EngineEvent]) -> None:
        for ev in events:
            live = self.live.get(ev.rid)
            if live is None:
                continue
            if ev.kind == "first_token":
                self._on_first(live, ev)
            elif ev.kind == "finished":
                self._on_finished(live, ev)
        if self.events is not None:
            self.events.flush()

    def _on_first(self, live: Live, ev: EngineEvent) -> None:
        if live.first_time is None:
            live.first_time = ev.time
            live.cached_tokens = ev.cached_tokens
            self.metrics.first_token(max(0.0, ev.time - live.arrival), live.stream)
        if not live.first.done():
            live.first.set_result(ev)

    def _on_finished(self, live: Live, ev: EngineEvent) -> None:
        if ev.finish_reason != "abort" and live.first_time is None:
            self._on_first(live, ev)
        if not live.first.done():
            live.first.set_result(ev)
        if not live.done.done():
            live.done.set_result(ev)
        self.live.pop(live.rid, None)
        decode_s = ev.time - live.first_time if live.first_time is not None else None
        self.metrics.finished(
            prompt_tokens=ev.prompt_tokens or live.prompt_tokens,
            completion_tokens=ev.completion_tokens,
            cached_tokens=ev.cached_tokens,
            e2e_s=max(0.0, ev.time - live.arrival),
            decode_s=decode_s,
            stream=live.stream,
            aborted=ev.finish_reason == "abort",
        )

    # ---- requests ---------------------------------------------------------------------------
    def submit(self, rid: str, plan: Plan, stream: bool) -> Live:
        assert self._loop is not None
        if rid in self.live:
            raise ApiError(f"Duplicate request ID: {rid}")
        now = self._catch_up()
        page = int(getattr(self.profile, "page_size", 1)) or 1
        final_text = plan.prompt_text + plan.final_text
        req = EngineRequest(
            rid=rid,
            prompt=text_blocks(plan.prompt_text, page),
            output_tokens=plan.output_tokens,
            max_new_tokens=plan.max_new_tokens,
            final_blocks=text_blocks(final_text, page),
            dp_rank=plan.dp_rank,
        )
        if self.events is not None:
            self.events.learn(plan.dp_rank, final_text, req.final_blocks)
        live = Live(
            rid=rid,
            prompt_tokens=plan.prompt_tokens,
            output_tokens=plan.output_tokens,
            reasoning=plan.reasoning,
            content=plan.content,
            tool_calls=plan.tool_calls,
            stream=stream,
            arrival=now,
            first=self._loop.create_future(),
            done=self._loop.create_future(),
        )
        self.live[rid] = live
        self.max_live = max(self.max_live, len(self.live))
        self.engine.submit(req, now)
        self._poke()
        return live

    def abort(self, rid: str) -> bool:
        live = self.live.get(rid)
        if live is None:
            return False
        now = self._catch_up()
        if rid not in self.live:  # finished while catching up
            return False
        generated = self.generated(live)
        self.engine.abort(rid, now)
        self._dispatch(self.engine.advance(now))
        if rid in self.live:  # the engine reports no event for an abort: end it here
            self._on_finished(
                live,
                EngineEvent(
                    kind="finished",
                    rid=rid,
                    time=now,
                    prompt_tokens=live.prompt_tokens,
                    completion_tokens=generated,
                    cached_tokens=live.cached_tokens,
                    finish_reason="abort",
                    message="Aborted by the client",
                ),
            )
        self._poke()
        return True

    def abort_later(self, rid: str, delay: float) -> None:
        """SGLang's ``create_abort_task``: abort ``delay`` wall seconds from now (no-op if done)."""
        if rid not in self.live or self._loop is None:
            return
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            self.abort(rid)

        handle = self._loop.call_later(delay, fire)
        self._timers.add(handle)

    def generated(self, live: Live) -> int:
        if live.done.done():
            return live.done.result().completion_tokens
        try:
            return min(int(self.engine.generated(live.rid)), live.output_tokens)
        except KeyError:
            return live.sent

    def record_trace(self, rid: str, request: Request) -> None:
        tp = request.headers.get("traceparent")
        if tp is None:
            return
        entry = {"rid": rid, "traceparent": tp, "tracestate": request.headers.get("tracestate")}
        self.last_trace = entry
        self.traceparents[rid] = entry
        while len(self.traceparents) > 1024:
            self.traceparents.popitem(last=False)

    async def wait_or_disconnect(
        self, fut: asyncio.Future[EngineEvent], live: Live, request: Request
    ) -> EngineEvent | None:
        """Wait for ``fut``; every 2 × abort_delay_s check the client (``_wait_one_response``)."""
        poll = max(0.05, 2 * self.abort_delay_s)
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(fut), poll)
            except TimeoutError:
                if await request.is_disconnected():
                    self.abort(live.rid)
                    return None

    # ---- state for info routes --------------------------------------------------------------
    def loads(self) -> list[RankLoad]:
        if self._loop is not None:
            self._catch_up()
        return list(self.engine.loads())

    def _snapshot(self) -> SchedulerSnapshot:
        return SchedulerSnapshot(loads=self.loads(), counters=self.engine.counters, tp_size=tp_size(self.profile))


def tp_size(profile: Any) -> int:
    """Tensor-parallel size: the profile's ``tp_size`` if it has one, else read from its name."""
    if getattr(profile, "tp_size", None):
        return int(profile.tp_size)
    m = re.search(r"(?:tp|dp)(\d+)", str(getattr(profile, "name", "")))
    return int(m.group(1)) if m else 1
