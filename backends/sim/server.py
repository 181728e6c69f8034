"""The live twin: one simulated SGLang 0.5.23 server (an :class:`Engine` behind SGLang's HTTP API).

Time: engine seconds run ``time_scale`` times as fast as wall seconds would (engine second =
``time_scale`` wall seconds), from the moment the app starts. One asyncio task drives the engine:
it sleeps until the wall time of ``next_time()``, applies every pass due by then and wakes the
handlers. Every duration the twin *reports* (metrics, ``meta_info.e2e_latency``, throughput) is in
engine seconds, so a time-scaled twin reports the latencies of the hardware it simulates.

Streaming: after the first token a handler polls its request every ``stream_interval_s`` wall
seconds and sends the tokens generated since the last chunk, so several tokens may share one SSE
chunk when time-scaled; token counts (usage) are always the engine's exact counts. As in SGLang,
no response byte is sent before the first token (a request that fails validation gets a 400 JSON).

Disconnect: ``abort_delay_s`` wall seconds (default 2.0, SGLang's value, not time-scaled) after a
streaming response ends or its client goes, the request is aborted (a no-op when finished); a
request still waiting for its first token or a non-streaming one checks the connection every
``2 × abort_delay_s`` (SGLang's 4 s). An aborted request frees its KV; its prefix stays cached.

Twin-only debug route (not in SGLang): ``GET /_twin/last_traceparent[?rid=R]`` returns the last
``traceparent``/``tracestate`` headers seen (overall, or for request id ``R``), so gateway tests can
check trace propagation. Deterministic behaviour rules are listed on :func:`create_app`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from backends.sim import responses as R
from backends.sim.chat_template import TemplateError, assistant_text, content_text, render_chat
from backends.sim.engine import EngineEvent, EngineRequest, RankLoad
from backends.sim.metrics import SchedulerSnapshot, TwinMetrics
from backends.sim.tokenizer import count_tokens, filler_text, text_blocks

log = logging.getLogger("cachegate.twin")

SGLANG_VERSION = "0.5.23"
DEFAULT_MODEL = "moonshotai/Kimi-K2-Instruct"
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
TOOL_TRIGGER = "call"
"""A chat request with ``tools`` whose last user message contains the word ``call`` (any case)
answers with one tool call to the first tool (id ``functions.NAME:0``)."""


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message, self.status, self.err_type = message, status, err_type


@dataclass(eq=False)
class _Live:
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
class _Plan:
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


def _seed(*parts: object) -> str:
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
        self.live: dict[str, _Live] = {}
        self.max_live = 0
        """Most requests in the twin at once (tests count concurrency at the backend with it)."""
        self.traceparents: OrderedDict[str, dict[str, str | None]] = OrderedDict()
        self.last_trace: dict[str, str | None] = {"rid": None, "traceparent": None, "tracestate": None}
        self.ready = False
        self.failed: Exception | None = None
        self.startup_time = time.time()
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None
        self._timers: set[asyncio.TimerHandle] = set()
        self.metrics = TwinMetrics(model, self._snapshot)

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
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
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

    def _on_first(self, live: _Live, ev: EngineEvent) -> None:
        if live.first_time is None:
            live.first_time = ev.time
            live.cached_tokens = ev.cached_tokens
            self.metrics.first_token(max(0.0, ev.time - live.arrival), live.stream)
        if not live.first.done():
            live.first.set_result(ev)

    def _on_finished(self, live: _Live, ev: EngineEvent) -> None:
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
    def submit(self, rid: str, plan: _Plan, stream: bool) -> _Live:
        assert self._loop is not None
        if rid in self.live:
            raise ApiError(f"Duplicate request ID: {rid}")
        now = self._catch_up()
        page = int(getattr(self.profile, "page_size", 1)) or 1
        req = EngineRequest(
            rid=rid,
            prompt=text_blocks(plan.prompt_text, page),
            output_tokens=plan.output_tokens,
            max_new_tokens=plan.max_new_tokens,
            final_blocks=text_blocks(plan.prompt_text + plan.final_text, page),
            dp_rank=plan.dp_rank,
        )
        live = _Live(
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

    def generated(self, live: _Live) -> int:
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
        self, fut: asyncio.Future[EngineEvent], live: _Live, request: Request
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

    # ---- planning ---------------------------------------------------------------------------
    def plan(
        self,
        prompt_text: str,
        body: dict[str, Any],
        *,
        max_tokens: Any,
        seed: object,
        tool_call: dict[str, Any] | None = None,
        want_reasoning: bool = False,
    ) -> _Plan:
        context = int(self.profile.context_length)
        prompt_tokens = count_tokens(prompt_text)
        if prompt_tokens >= context:
            raise ApiError(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context} tokens)."
            )
        if max_tokens is not None:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
                raise ApiError("max_tokens must be a non-negative integer", err_type="Bad Request")
            if prompt_tokens + max_tokens > context:
                raise ApiError(
                    f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                    f"You requested a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} tokens from "
                    f"the input messages and {max_tokens} tokens for the completion. Please reduce the number "
                    f"of tokens in the input messages or the completion to fit within the limit."
                )
            budget = max_tokens
        else:
            budget = context - prompt_tokens
        key = _seed(seed, prompt_text)
        natural = 64 + int(key, 16) % 449  # 64..512 tokens when the client sets no limit
        dp_rank = body.get("routed_dp_rank", body.get("data_parallel_rank"))
        if dp_rank is not None and (
            isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or not 0 <= dp_rank < self.engine.dp_size
        ):
            raise ApiError(f"routed_dp_rank={dp_rank} is out of range [0, {self.engine.dp_size})")
        reasoning_text = ""
        if want_reasoning:
            r = min(budget, max(1, natural // 3))
            reasoning_text = filler_text(_seed(key, "reasoning"), r)
        room = budget - count_tokens(reasoning_text)
        calls: list[dict[str, Any]] | None = None
        if tool_call is not None:
            calls = [tool_call]
            markup = assistant_text("", calls)
            if count_tokens(markup) <= room:
                n_content = count_tokens(markup)
                content, finish, final = "", "tool_calls", markup
            else:
                calls = None
        if calls is None:
            n_content = min(natural, room) if max_tokens is None else room
            content = filler_text(key, n_content)
            finish = "stop" if max_tokens is None else "length"
            final = content
        output = count_tokens(reasoning_text) + n_content
        return _Plan(
            prompt_text=prompt_text,
            prompt_tokens=prompt_tokens,
            output_tokens=output,
            max_new_tokens=budget,
            reasoning=reasoning_text,
            content=content,
            tool_calls=calls,
            finish_reason=finish,
            final_text=final,
            dp_rank=dp_rank,
        )


# ---- helpers -------------------------------------------------------------------------------------


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _err(e: ApiError) -> Response:
    return _json(R.error_body(e.message, e.err_type, e.status), e.status)


def _validation_error(message: str) -> Response:
    # RequestValidationError handler: ErrorResponse with type = HTTPStatus.BAD_REQUEST.phrase.
    return _json(R.error_body(message, "Bad Request", 400), 400)


async def _json_body(request: Request) -> dict[str, Any]:
    media = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if media != "application/json":
        raise ApiError(
            "1 validation error:\n  {'loc': ('header', 'content-type'), 'msg': \"Unsupported Media "
            "Type: Only 'application/json' is allowed\", 'type': 'value_error'}",
            err_type="Bad Request",
        )
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise ApiError(f"JSON decode error: {e}", err_type="Bad Request") from e
    if not isinstance(body, dict):
        raise ApiError("Input should be a valid dictionary or object to extract fields from", err_type="Bad Request")
    return body


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise ApiError("stream_options must be an object", err_type="Bad Request")
    return bool(so.get("include_usage")), bool(so.get("continuous_usage_stats"))


def _max_tokens(body: dict[str, Any], *names: str) -> Any:
    for n in names:
        if body.get(n) is not None:
            return body[n]
    return None


def _tool_call_for(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    if not tools or body.get("tool_choice") == "none":
        return None
    users = [m for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
    if not users or TOOL_TRIGGER not in content_text(users[-1].get("content")).lower():
        return None
    fn = (tools[0] or {}).get("function") or {}
    name = str(fn.get("name", "tool"))
    props = sorted(((fn.get("parameters") or {}).get("properties") or {}).keys())
    args = json.dumps({p: f"value-{i}" for i, p in enumerate(props)}, sort_keys=True)
    return {"id": f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": args}}


# ---- app -----------------------------------------------------------------------------------------


def create_app(
    profile: Any = "tiny",
    *,
    time_scale: float = 1.0,
    model: str = DEFAULT_MODEL,
    kv_tokens: int | None = None,
    unbounded: bool = False,
    cache_report: bool = True,
    abort_delay_s: float = 2.0,
    stream_interval_s: float = 0.03,
    reasoning: bool = False,
    startup_delay_s: float = 0.0,
    engine_factory: Callable[..., Any] | None = None,
) -> Starlette:
    """A Starlette app serving one simulated SGLang 0.5.23 server.

    ``profile``: a profile name or object. ``cache_report=False`` mimics a server started without
    ``--enable-cache-report`` (``prompt_tokens_details`` null). ``reasoning=True`` (or a request with
    ``chat_template_kwargs: {"thinking": true}``) streams about a third of the answer as
    ``reasoning_content`` first. Tool calls: see :data:`TOOL_TRIGGER`. Output length: ``max_tokens``
    / ``max_completion_tokens`` / ``max_new_tokens`` when given (finish ``length``), else 64-512 tokens
    chosen from the prompt (finish ``stop``). ``startup_delay_s``: /health answers 503 that long.
    """
    from backends.sim import engine as engine_mod
    from backends.sim import profiles as profiles_mod

    prof = profiles_mod.get_profile(profile) if isinstance(profile, str) else profile
    factory = engine_factory or engine_mod.Engine  # type: ignore[attr-defined]
    engine = factory(prof, kv_tokens=kv_tokens, unbounded=unbounded)
    twin = Twin(
        engine,
        profile=prof,
        model=model,
        time_scale=time_scale,
        cache_report=cache_report,
        abort_delay_s=abort_delay_s,
        stream_interval_s=stream_interval_s,
        reasoning=reasoning,
        startup_delay_s=startup_delay_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await twin.start()
        try:
            yield
        finally:
            await twin.stop()

    routes = [
        Route("/health", _health, methods=["GET"]),
        Route("/health_generate", _health, methods=["GET"]),
        Route("/get_model_info", _model_info, methods=["GET"]),
        Route("/model_info", _model_info, methods=["GET"]),
        Route("/get_server_info", _server_info, methods=["GET"]),
        Route("/server_info", _server_info, methods=["GET"]),
        Route("/v1/loads", _v1_loads, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/flush_cache", _flush_cache, methods=["GET", "POST"]),
        Route("/abort_request", _abort_request, methods=["POST"]),
        Route("/generate", _generate, methods=["POST", "PUT"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/v1/models/{model:path}", _model, methods=["GET"]),
        Route("/v1/chat/completions", _chat, methods=["POST"]),
        Route("/v1/completions", _completions, methods=["POST"]),
        Route("/_twin/last_traceparent", _last_traceparent, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.twin = twin
    return app


def tp_size(profile: Any) -> int:
    """Tensor-parallel size: the profile's ``tp_size`` if it has one, else read from its name."""
    if getattr(profile, "tp_size", None):
        return int(profile.tp_size)
    m = re.search(r"(?:tp|dp)(\d+)", str(getattr(profile, "name", "")))
    return int(m.group(1)) if m else 1


def _twin(request: Request) -> Twin:
    return request.app.state.twin  # type: ignore[no-any-return]


async def _health(request: Request) -> Response:
    return Response(status_code=200 if _twin(request).ready else 503)


async def _model_info(request: Request) -> Response:
    t = _twin(request)
    return _json(
        {
            "model_path": t.model,
            "served_model_name": t.model,
            "tokenizer_path": t.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "auto",
            "reasoning_parser": "kimi_k2",
            "tool_call_parser": "kimi_k2",
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kimi_k2",
            "architectures": ["DeepseekV3ForCausalLM"],
        }
    )


async def _server_info(request: Request) -> Response:
    t = _twin(request)
    p, e = t.profile, t.engine
    loads = t.loads()
    kv_gb = float(getattr(p, "kv_gb_per_rank", 0.0))
    states = [
        {
            "dp_rank": ld.dp_rank,
            "last_gen_throughput": ld.gen_throughput,
            "load": ld.num_running_reqs + ld.num_waiting_reqs,
            "memory_usage": {
                "weight": float(getattr(p, "weight_gb_per_gpu", 0.0)),
                "kvcache": kv_gb,
                "token_capacity": ld.max_total_num_tokens,
                "graph": 0.0,
            },
            "num_running_reqs": ld.num_running_reqs,
            "num_waiting_reqs": ld.num_waiting_reqs,
            "token_usage": ld.token_usage,
            "cache_hit_rate": ld.cache_hit_rate,
        }
        for ld in loads
    ]
    tp = tp_size(p)
    info = {
        "model_path": t.model,
        "served_model_name": t.model,
        "tokenizer_path": t.model,
        "tp_size": tp,
        "dp_size": e.dp_size,
        "pp_size": int(getattr(p, "pp", 1)),
        "ep_size": 1,
        "enable_dp_attention": e.dp_size > 1,
        "load_balance_method": "round_robin",
        "page_size": p.page_size,
        "chunked_prefill_size": p.chunked_prefill_size,
        "max_prefill_tokens": p.max_prefill_tokens,
        "max_running_requests": p.max_running_requests,  # per DP rank, as the scheduler reports it
        "schedule_policy": "fcfs",
        "schedule_conservativeness": getattr(p, "schedule_conservativeness", 1.0),  # × 0.3 under DP attention
        "context_length": p.context_length,
        "mem_fraction_static": float(getattr(p, "mem_fraction_static", 0.9)),
        "kv_cache_dtype": str(getattr(p, "kv_cache_dtype", "auto")),
        "enable_hierarchical_cache": bool(getattr(p, "host_kv_tokens", 0)),
        "enable_cache_report": t.cache_report,
        "enable_metrics": True,
        "enable_trace": False,
        "reasoning_parser": "kimi_k2",
        "tool_call_parser": "kimi_k2",
        "max_total_num_tokens": e.max_total_num_tokens,
        "max_req_input_len": p.context_length - 1,
        "startup_time": t.startup_time,
        "internal_states": states,
        "version": SGLANG_VERSION,
        "frontend": "python",
        "twin": {"profile": getattr(p, "name", "?"), "time_scale": t.time_scale},
    }
    return _json(info)


_LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def _load_dict(t: Twin, ld: RankLoad, include: set[str] | None) -> dict[str, Any]:
    x = ld.extra
    used = ld.num_used_tokens
    pending = int(x.get("num_pending_tokens", 0))
    d: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": ld.dp_rank,
        "num_running_reqs": ld.num_running_reqs,
        "num_waiting_reqs": ld.num_waiting_reqs,
        "num_waiting_uncached_tokens": int(x.get("num_waiting_uncached_tokens", 0)),
        "num_used_tokens": used,
        "num_total_tokens": used + pending,
        "num_active_tokens": used + pending,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": ld.max_total_num_tokens,
        "max_running_requests": ld.max_running_requests,
        "token_usage": ld.token_usage,
        "gen_throughput": ld.gen_throughput,
        "cache_hit_rate": ld.cache_hit_rate,
        "utilization": float(x.get("utilization", ld.token_usage)),
        "total_prefill_uncached_tokens": int(x.get("total_prefill_uncached_tokens", 0)),
        "total_prefill_busy_us": int(x.get("total_prefill_busy_us", 0)),
        "decode_moments": None,
    }
    if include == {"core"}:
        return d
    if include is None or "all" in include or "memory" in include:
        d["memory"] = {
            "weight_gb": float(getattr(t.profile, "weight_gb_per_gpu", 0.0)),
            "kv_cache_gb": float(getattr(t.profile, "kv_gb_per_rank", 0.0)),
            "graph_gb": 0.0,
            "token_capacity": ld.max_total_num_tokens,
        }
    if include is None or "all" in include or "queues" in include:
        d["queues"] = {
            "waiting": ld.num_waiting_reqs,
            "grammar": 0,
            "paused": 0,
            "retracted": int(x.get("num_retracted_reqs", 0)),
            "prealloc_ready": 0,
        }
    return d


async def _v1_loads(request: Request) -> Response:
    t = _twin(request)
    q = request.query_params
    include = {s.strip() for s in q["include"].split(",")} if q.get("include") else None
    if include is not None and not include <= _LOAD_SECTIONS:
        msg = f"Invalid include sections: {include - _LOAD_SECTIONS}. Valid options: {sorted(_LOAD_SECTIONS)}"
        return _json(R.error_body(msg, "400", 400), 400)
    loads = t.loads()
    if q.get("dp_rank") is not None:
        try:
            rank = int(q["dp_rank"])
        except ValueError:
            return _validation_error(f"Input should be a valid integer: dp_rank={q['dp_rank']!r}")
        loads = [ld for ld in loads if ld.dp_rank == rank]
        if not loads:
            return _json(R.error_body(f"dp_rank {rank} out of range [0, {t.engine.dp_size})", "400", 400), 400)
    dicts = [_load_dict(t, ld, include) for ld in loads]
    if q.get("format") == "prometheus":
        samples: dict[str, list[tuple[int, float]]] = {}
        prefixes = {"speculative": "spec", "disaggregation": "disagg"}
        for d in dicts:
            d = dict(d)
            rank = d.pop("dp_rank")
            for k, v in d.items():
                if isinstance(v, dict):
                    for sk, sv in v.items():
                        if isinstance(sv, int | float):
                            samples.setdefault(f"sglang_{prefixes.get(k, k)}_{sk}", []).append((rank, sv))
                elif isinstance(v, int | float):
                    samples.setdefault(f"sglang_{k}", []).append((rank, v))
        lines: list[str] = []
        for name, vals in samples.items():
            lines.append(f"# TYPE {name} gauge")
            lines.extend(f'{name}{{dp_rank="{r}"}} {v}' for r, v in vals)
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")
    return _json(
        {
            "timestamp": datetime.now(UTC).isoformat(),
            "version": SGLANG_VERSION,
            "accelerator": getattr(t.profile, "accelerator", None),
            "num_accelerators": max(1, tp_size(t.profile) * int(getattr(t.profile, "pp", 1)) // t.engine.dp_size),
            "loads": dicts,
        }
    )


async def _metrics(request: Request) -> Response:
    t = _twin(request)
    # SGLang serves its metrics in prometheus-client's multiprocess mode, which has no *_created series.
    lines = generate_latest(t.metrics.registry).decode().splitlines(keepends=True)
    body = "".join(ln for ln in lines if not _CREATED.match(ln))
    return Response(body, media_type=CONTENT_TYPE_LATEST)


_CREATED = re.compile(r"^(# (HELP|TYPE) )?\S+_created[ {]")


async def _flush_cache(request: Request) -> Response:
    t = _twin(request)
    t._catch_up()
    if t.engine.flush_cache():
        return Response(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n",
            status_code=200,
        )
    return Response("Flush cache failed.\n", status_code=400)


async def _abort_request(request: Request) -> Response:
    t = _twin(request)
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError:
        return _validation_error("JSON decode error")
    if not isinstance(body, dict):
        return _validation_error("Input should be a valid dictionary")
    if body.get("abort_all"):
        for rid in list(t.live):
            t.abort(rid)
    elif body.get("rid"):
        t.abort(str(body["rid"]))
    return Response(status_code=200)


async def _models(request: Request) -> Response:
    t = _twin(request)
    return _json({"object": "list", "data": [_card(t)]})


def _card(t: Twin) -> dict[str, Any]:
    return {
        "id": t.model,
        "object": "model",
        "created": int(t.startup_time),
        "owned_by": "sglang",
        "root": t.model,
        "parent": None,
        "max_model_len": t.profile.context_length,
    }


async def _model(request: Request) -> Response:
    t = _twin(request)
    name = request.path_params["model"]
    if name != t.model:
        return _json(
            {
                "error": {
                    "message": f"The model '{name}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            404,
        )
    return _json(_card(t))


async def _last_traceparent(request: Request) -> Response:
    t = _twin(request)
    rid = request.query_params.get("rid")
    if rid is not None:
        entry = t.traceparents.get(rid)
        return _json(entry or {"rid": rid, "traceparent": None, "tracestate": None})
    return _json(t.last_trace)


# ---- chat / completions / generate --------------------------------------------------------------


async def _run(t: Twin, request: Request, body: dict[str, Any], plan: Any) -> tuple[Any, str, str, int, Any] | Response:
    """Submit ``plan`` and wait for its first token, and for a non-streamed request its end:
    ``(live, rid, model, created, finished event or None)``, or the response to send instead."""
    stream = bool(body.get("stream"))
    rid = str(body.get("rid") or uuid.uuid4().hex)
    t.record_trace(rid, request)
    try:
        live = t.submit(rid, plan, stream)
    except ApiError as e:
        return _err(e)
    model = str(body.get("model") or t.model)
    created = int(time.time())
    if await t.wait_or_disconnect(live.first, live, request) is None:
        return Response(status_code=499)
    done = None
    if not stream:
        done = await t.wait_or_disconnect(live.done, live, request)
        if done is None:
            return Response(status_code=499)
    return live, rid, model, created, done


async def _chat(request: Request) -> Response:
    t = _twin(request)
    try:
        body = await _json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(
                "1 validation error for ChatCompletionRequest\nmessages\n  Field required", err_type="Bad Request"
            )
        tools = body.get("tools")
        prompt = render_chat(messages, tools if isinstance(tools, list) else None)
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = t.reasoning or bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
        plan = t.plan(
            prompt,
            body,
            max_tokens=_max_tokens(body, "max_completion_tokens", "max_tokens"),
            seed=body.get("seed", ""),
            tool_call=_tool_call_for(body),
            want_reasoning=thinking,
        )
        include_usage, continuous = _stream_options(body)
    except TemplateError as e:
        return _err(ApiError(str(e)))
    except ApiError as e:
        return _err(e)
    ran = await _run(t, request, body, plan)
    if isinstance(ran, Response):
        return ran
    live, rid, model, created, done = ran
    if done is not None:
        return _json(_chat_final(t, live, plan, done, rid, created, model))
    return StreamingResponse(
        _chat_stream(t, live, plan, rid, created, model, include_usage, continuous), media_type="text/event-stream"
    )


def _finish(plan: _Plan, ev: EngineEvent) -> tuple[str, int | None]:
    if ev.finish_reason == "abort":
        return "abort", None
    if plan.finish_reason == "stop":
        return "stop", R.KIMI_EOS_TOKEN_ID
    return plan.finish_reason, None


def _chat_final(
    t: Twin, live: _Live, plan: _Plan, ev: EngineEvent, rid: str, created: int, model: str
) -> dict[str, Any]:
    n = ev.completion_tokens
    r_tokens = min(n, live.reasoning_tokens)
    reasoning = live.reasoning[: 4 * r_tokens] if live.reasoning else None
    content_tokens = n - r_tokens
    finish, matched = _finish(plan, ev)
    calls = live.tool_calls if finish == "tool_calls" else None
    content = "" if live.tool_calls else live.content[: 4 * content_tokens]
    u = R.usage(
        ev.prompt_tokens or live.prompt_tokens, n, ev.cached_tokens, cache_report=t.cache_report, reasoning=r_tokens
    )
    return R.chat_response(
        rid,
        created,
        model,
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=finish,
        matched_stop=matched,
        usage_=u,
    )


async def _chat_stream(
    t: Twin, live: _Live, plan: _Plan, rid: str, created: int, model: str, include_usage: bool, continuous: bool
) -> AsyncIterator[bytes]:
    r_tokens = live.reasoning_tokens

    def cont_usage(n: int) -> dict[str, Any] | None:
        if not continuous:
            return None
        return R.usage(live.prompt_tokens, n, live.cached_tokens, cache_report=False, reasoning=min(n, r_tokens))

    def deltas(upto: int) -> list[bytes]:
        out: list[bytes] = []
        lo, hi = live.sent, upto
        if lo >= hi:
            return out
        if lo < r_tokens:
            out.append(
                R.sse(
                    R.chat_chunk(
                        rid,
                        created,
                        model,
                        reasoning=live.reasoning[4 * lo : 4 * min(hi, r_tokens)],
                        usage_=cont_usage(hi),
                    )
                )
            )
        if hi > r_tokens and not live.tool_calls:
            a, b = max(lo, r_tokens) - r_tokens, hi - r_tokens
            out.append(
                R.sse(R.chat_chunk(rid, created, model, content=live.content[4 * a : 4 * b], usage_=cont_usage(hi)))
            )
        live.sent = hi
        return out

    try:
        yield R.sse(R.chat_chunk(rid, created, model, role="assistant", content=""))
        while True:
            if live.done.done():
                break
            for chunk in deltas(t.generated(live)):
                yield chunk
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
        ev = live.done.result()
        for chunk in deltas(ev.completion_tokens):
            yield chunk
        finish, matched = _finish(plan, ev)
        if finish == "tool_calls" and live.tool_calls:
            yield R.sse(R.chat_tool_call_chunk(rid, created, model, live.tool_calls, cont_usage(ev.completion_tokens)))
        yield R.sse(R.chat_chunk(rid, created, model, finish_reason=finish, matched_stop=matched))
        if include_usage:
            yield R.sse(
                R.chat_usage_chunk(
                    rid,
                    created,
                    model,
                    R.usage(
                        ev.prompt_tokens or live.prompt_tokens,
                        ev.completion_tokens,
                        ev.cached_tokens,
                        cache_report=t.cache_report,
                        reasoning=min(ev.completion_tokens, r_tokens),
                    ),
                )
            )
        yield R.DONE
    finally:
        t.abort_later(rid, t.abort_delay_s)


async def _completions(request: Request) -> Response:
    t = _twin(request)
    try:
        body = await _json_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError("The twin supports one string prompt per completion request", err_type="Bad Request")
        plan = t.plan(prompt, body, max_tokens=_max_tokens(body, "max_tokens"), seed=body.get("seed", ""))
        include_usage, continuous = _stream_options(body)
    except ApiError as e:
        return _err(e)
    ran = await _run(t, request, body, plan)
    if isinstance(ran, Response):
        return ran
    live, rid, model, created, ev = ran
    if ev is not None:
        finish, matched = _finish(plan, ev)
        u = R.usage(
            ev.prompt_tokens or live.prompt_tokens, ev.completion_tokens, ev.cached_tokens, cache_report=t.cache_report
        )
        return _json(
            R.completion_response(
                rid,
                created,
                model,
                text=live.content[: 4 * ev.completion_tokens],
                finish_reason=finish,
                matched_stop=matched,
                usage_=u,
            )
        )

    async def gen() -> AsyncIterator[bytes]:
        def usage_now(n: int) -> dict[str, Any] | None:
            return R.usage(live.prompt_tokens, n, 0, cache_report=False) if continuous else None

        try:
            while not live.done.done():
                n = t.generated(live)
                if n > live.sent:
                    text = live.content[4 * live.sent : 4 * n]
                    live.sent = n
                    yield R.sse(
                        R.completion_chunk(
                            rid, created, model, text=text, finish_reason=None, matched_stop=None, usage_=usage_now(n)
                        )
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
            ev = live.done.result()
            finish, matched = _finish(plan, ev)
            text = live.content[4 * live.sent : 4 * ev.completion_tokens]
            live.sent = ev.completion_tokens
            yield R.sse(
                R.completion_chunk(
                    rid,
                    created,
                    model,
                    text=text,
                    finish_reason=finish,
                    matched_stop=matched,
                    usage_=usage_now(ev.completion_tokens),
                )
            )
            if include_usage:
                yield R.sse(
                    R.completion_usage_chunk(
                        rid,
                        created,
                        model,
                        R.usage(
                            ev.prompt_tokens or live.prompt_tokens,
                            ev.completion_tokens,
                            ev.cached_tokens,
                            cache_report=t.cache_report,
                        ),
                    )
                )
            yield R.DONE
        finally:
            t.abort_later(rid, t.abort_delay_s)

    return StreamingResponse(gen(), media_type="text/event-stream")


def _meta(t: Twin, live: _Live, rid: str, n: int, ev: EngineEvent | None, plan: _Plan) -> dict[str, Any]:
    fr: dict[str, Any] | None = None
    if ev is not None:
        finish, matched = _finish(plan, ev)
        if finish == "abort":
            fr = {"type": "abort", "message": ev.message or "Abort"}
        elif finish == "length":
            fr = {"type": "length", "length": n}
        else:
            fr = {"type": "stop", "matched": matched}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": fr,
        "prompt_tokens": live.prompt_tokens,
        "weight_version": "default",
        "total_retractions": ev.retractions if ev else 0,
        "completion_tokens": n,
        "cached_tokens": live.cached_tokens,
    }
    if ev is not None:
        meta["e2e_latency"] = max(0.0, ev.time - live.arrival)
    return meta


async def _generate(request: Request) -> Response:
    t = _twin(request)
    try:
        body = orjson.loads(await request.body())
        if not isinstance(body, dict):
            raise ApiError("Input should be a valid dictionary")
        text = body.get("text")
        if text is None and isinstance(body.get("input_ids"), list):
            # Token ids: each id stands for 4 bytes so counts stay exact.
            text = "".join(f"{int(i) % 10000:04d}" for i in body["input_ids"])
        if not isinstance(text, str):
            raise ApiError("Either text or input_ids should be provided.")
        sp = body.get("sampling_params") or {}
        plan = t.plan(text, body, max_tokens=sp.get("max_new_tokens"), seed=sp.get("seed", ""))
    except orjson.JSONDecodeError:
        return _json({"error": {"message": "JSON decode error"}}, 400)
    except ApiError as e:
        return _json({"error": {"message": e.message}}, 400)
    stream = bool(body.get("stream"))
    rid = str(body.get("rid") or uuid.uuid4().hex)
    t.record_trace(rid, request)
    try:
        live = t.submit(rid, plan, stream)
    except ApiError as e:
        return _json({"error": {"message": e.message}}, 400)
    if not stream:
        ev = await t.wait_or_disconnect(live.done, live, request)
        if ev is None:
            return Response(status_code=499)
        n = ev.completion_tokens
        return _json(
            {
                "text": live.content[: 4 * n],
                "output_ids": _ids(live.content, n),
                "meta_info": _meta(t, live, rid, n, ev, plan),
            }
        )

    async def gen() -> AsyncIterator[bytes]:
        try:
            first = await t.wait_or_disconnect(live.first, live, request)
            if first is None:
                return
            while not live.done.done():
                n = t.generated(live)
                if n > live.sent:
                    live.sent = n
                    yield R.sse(
                        {
                            "text": live.content[: 4 * n],
                            "output_ids": _ids(live.content, n),
                            "meta_info": _meta(t, live, rid, n, None, plan),
                        }
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
            ev = live.done.result()
            n = ev.completion_tokens
            yield R.sse(
                {
                    "text": live.content[: 4 * n],
                    "output_ids": _ids(live.content, n),
                    "meta_info": _meta(t, live, rid, n, ev, plan),
                }
            )
            yield R.DONE
        finally:
            t.abort_later(rid, t.abort_delay_s)

    return StreamingResponse(gen(), media_type="text/event-stream")


def _ids(text: str, n: int) -> list[int]:
    """Deterministic stand-in token ids for the first ``n`` 4-byte tokens of ``text``."""
    data = text.encode()
    return [int.from_bytes(data[4 * i : 4 * i + 4].ljust(4, b" "), "little") % 163840 for i in range(n)]
