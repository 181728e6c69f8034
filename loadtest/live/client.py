"""Live load client: a workload against any OpenAI-compatible URL, in wall-clock time.

Each closed-loop slot keeps a chat history: turn n+1 sends turn n's messages, the assistant answer
exactly as it streamed in, and the new tool result (rendered with ``filler_text``, so the token
counts are the planned ones on the twin's 4-bytes-per-token tokenizer). Trace workloads are sent
open loop at their arrival times. Several ``base_urls`` are used round-robin per request (the live
``direct`` baseline). TTFT is taken at the first generated delta (``content``, ``reasoning_content``
or ``tool_calls``); tokens come from the usage chunk (``stream_options.include_usage``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

from loadtest.results.metrics import RequestRecord, percentile, summarize, team_rows
from loadtest.workloads.core import CodingAgent, Segment, TeamSpec, TraceWorkload, Workload, slot_teams
from loadtest.workloads.spec import make_workload


@dataclass
class LiveConfig:
    base_urls: list[str]
    model: str
    api_key: str | None = None
    workload: str = "coding-agent"
    conversations: int = 8
    teams: list[TeamSpec] | None = None
    duration_s: float = 60.0
    warmup_s: float = 0.0
    seed: int = 1
    scale: float = 1.0
    think_scale: float = 1.0
    speedup: float = 1.0
    max_requests: int = 100_000
    request_timeout_s: float = 600.0
    system: str = "target"
    """Label of the system under test in the report."""
    warm_start: bool = False
    """coding-agent: enter each slot's first conversation at a random turn (``CodingAgent``)."""
    first_slot: int = 0
    """coding-agent: index of the first slot (slots ``first_slot … first_slot + N − 1``: one share of a
    fleet's conversations, ``loadtest/demo/mixed_live.py``)."""


@dataclass
class LevelState:
    """What the progress display reads while a level runs."""

    conversations: int
    started: float = field(default_factory=time.monotonic)
    records: list[RequestRecord] = field(default_factory=list)
    done: bool = False
    ended: float | None = None

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def completed(self) -> int:
        return sum(1 for r in self.records if r.finish is not None and r.ok)

    def ttft_p50(self) -> float | None:
        return percentile([r.first_token - r.arrival for r in self.records if r.first_token is not None], 50)


class _Runner:
    def __init__(self, cfg: LiveConfig, workload: Workload, state: LevelState, stop: asyncio.Event) -> None:
        self.cfg = cfg
        self.workload = workload
        self.state = state
        self.stop = stop
        self.t0 = time.monotonic()
        self._url = itertools.cycle(cfg.base_urls)
        self._rid = itertools.count()
        self.keys = {t.name: t.key for t in (cfg.teams or [])}
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(cfg.request_timeout_s, connect=10.0), limits=limits)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _budget_left(self) -> bool:
        return not self.stop.is_set() and len(self.state.records) < self.cfg.max_requests

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopped first; True if the run should go on."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), seconds)
        return self._budget_left()

    async def request(self, rec: RequestRecord, messages: list[dict], max_tokens: int) -> str | None:
        """Send one streaming chat completion; fill ``rec``; return the answer text (None on error)."""
        url = next(self._url).rstrip("/")
        rec.backend = url
        headers = {"content-type": "application/json"}
        key = self.keys.get(rec.team) or self.cfg.api_key
        if key:
            headers["authorization"] = f"Bearer {key}"
        body = {
            "model": self.cfg.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "ignore_eos": True,
        }  # SGLang's flag: exactly the workload's answer length
        parts: list[str] = []
        try:
            async with self.http.stream(
                "POST", f"{url}/v1/chat/completions", content=orjson.dumps(body), headers=headers
            ) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    rec.error = f"http_{resp.status_code}"
                    return None
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = orjson.loads(payload)
                    if "error" in chunk:
                        rec.error = "stream_error"
                        return None
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        text = delta.get("content") or ""
                        if rec.first_token is None and (
                            text or delta.get("reasoning_content") or delta.get("tool_calls")
                        ):
                            rec.first_token = self.now()
                        parts.append(text)
                    usage = chunk.get("usage")
                    if usage:
                        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        rec.output_tokens = int(usage.get("completion_tokens") or 0)
                        details = usage.get("prompt_tokens_details") or {}
                        rec.cached_tokens = int(details.get("cached_tokens") or 0)
        except (httpx.HTTPError, ValueError) as exc:
            rec.error = type(exc).__name__
            return None
        rec.finish = self.now()
        return "".join(parts)

    def _record(self, team: str, slot: int | None) -> RequestRecord:
        rec = RequestRecord(f"r{next(self._rid)}", team=team, slot=slot, arrival=self.now())
        self.state.records.append(rec)
        return rec

    async def slot_loop(self, w: CodingAgent, slot: int, team: str) -> None:
        for conv in w.conversations(slot, team):
            messages: list[dict] = []
            for turn in conv.turns:
                if not await self._sleep(turn.think_s):
                    return
                messages.extend(_message(seg) for seg in turn.new)
                while True:
                    rec = self._record(team, slot)
                    answer = await self.request(rec, messages, turn.output_tokens)
                    if answer is not None:
                        break
                    rec.ok, rec.finish = False, self.now()
                    if not await self._sleep(1.0):  # back off, then resend the same turn
                        return
                messages.append({"role": "assistant", "content": answer})

    async def trace_loop(self, w: TraceWorkload) -> None:
        tasks: set[asyncio.Task] = set()
        for req in w.requests(self.cfg.teams, until_s=self.cfg.duration_s):
            if not await self._sleep(req.arrival_s - self.now()):
                break
            rec = self._record(req.team, None)
            task = asyncio.create_task(self._one_shot(rec, req.prompt, req.output_tokens))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)

    async def _one_shot(self, rec: RequestRecord, prompt: Segment, output_tokens: int) -> None:
        if await self.request(rec, [_message(prompt)], output_tokens) is None:
            rec.ok, rec.finish = False, self.now()

    async def run(self) -> None:
        if isinstance(self.workload, CodingAgent):
            teams = self.cfg.teams or [TeamSpec("default", self.cfg.conversations)]
            slots = enumerate(slot_teams(teams), start=self.cfg.first_slot)
            jobs = [self.slot_loop(self.workload, i, t) for i, t in slots]
        else:
            jobs = [self.trace_loop(self.workload)]
        tasks = [asyncio.create_task(j) for j in jobs]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.cfg.duration_s)
        finally:
            self.stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.http.aclose()


def _message(seg: Segment) -> dict:
    return {"role": seg.role, "content": seg.text()}


async def run_level(cfg: LiveConfig, state: LevelState | None = None, stop: asyncio.Event | None = None) -> dict:
    """One concurrency level; returns its row (the simulator's fields where they apply)."""
    workload = make_workload(
        cfg.workload,
        seed=cfg.seed,
        scale=cfg.scale,
        think_scale=cfg.think_scale,
        speedup=cfg.speedup,
        warm_start=cfg.warm_start,
    )
    teams = cfg.teams or [TeamSpec("default", cfg.conversations)]
    state = state or LevelState(sum(t.conversations for t in teams))
    interrupted = stop is not None and stop.is_set()
    level_stop = asyncio.Event()
    if interrupted:
        level_stop.set()

    async def relay() -> None:  # a global stop (Ctrl-C) ends this level too
        if stop is not None:
            await stop.wait()
            level_stop.set()

    relay_task = asyncio.create_task(relay())
    runner = _Runner(cfg, workload, state, level_stop)
    try:
        await runner.run()
    finally:
        relay_task.cancel()
        state.done = True
        state.ended = time.monotonic()
    end = min(runner.now(), cfg.duration_s)
    closed = isinstance(workload, CodingAgent)
    row: dict = {
        "system": cfg.system,
        "base_urls": cfg.base_urls,
        "model": cfg.model,
        "workload": workload.name,
        "seed": cfg.seed,
        "conversations": state.conversations if closed else None,
        "duration_s": round(end, 2),
        "requests": len(state.records),
        "interrupted": bool(stop is not None and stop.is_set()),
    }
    start = min(cfg.warmup_s, end)
    slots = dict(enumerate(slot_teams(teams), start=cfg.first_slot)) if closed else None
    row.update(summarize(state.records, start, end, slots=slots, backends=cfg.base_urls))
    row["teams"] = team_rows(state.records, start, end, {t.name: t.conversations for t in teams})
    return row


def progress_table(states: list[LevelState], system: str):  # type: ignore[no-untyped-def]
    from rich.table import Table

    table = Table(title=f"load test: {system}", header_style="bold")
    for col in ("Conv.", "Elapsed", "Requests done", "TTFT p50"):
        table.add_column(col, justify="right")
    for s in states:
        p50 = s.ttft_p50()
        table.add_row(
            str(s.conversations),
            f"{s.elapsed():.0f} s" + ("" if s.done else " …"),
            str(s.completed()),
            "-" if p50 is None else f"{p50:.2f} s",
        )
    return table


async def sweep(
    base: LiveConfig,
    levels: list[int],
    *,
    show_progress: bool = True,
    on_level: Callable[[LiveConfig], None] | None = None,
    vary_seed: bool = False,
) -> list[dict]:
    """Run ``levels`` one after the other; Ctrl-C stops cleanly and keeps the finished rows (and
    the partial one). ``on_level`` runs before each level (the demo flushes caches there);
    ``vary_seed`` gives level i the seed ``seed + i`` (fresh conversations per level)."""
    from rich.console import Console
    from rich.live import Live

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    rows: list[dict] = []
    states: list[LevelState] = []
    console = Console()
    try:
        with Live(
            progress_table(states, base.system),
            console=console,
            refresh_per_second=2,
            transient=False,
            auto_refresh=show_progress and console.is_terminal,
        ) as live:

            async def refresh() -> None:
                while True:
                    live.update(progress_table(states, base.system))
                    await asyncio.sleep(0.5)

            ticker = asyncio.create_task(refresh())
            try:
                levels_iter = levels if (base.teams is None and base.workload == "coding-agent") else levels[:1]
                for i, n in enumerate(levels_iter):
                    if stop.is_set():
                        break
                    cfg = LiveConfig(
                        **{**base.__dict__, "conversations": n, "seed": base.seed + (i if vary_seed else 0)}
                    )
                    if on_level is not None:
                        await asyncio.to_thread(on_level, cfg)
                    state = LevelState(sum(t.conversations for t in cfg.teams) if cfg.teams else n)
                    states.append(state)
                    rows.append(await run_level(cfg, state, stop))
            finally:
                ticker.cancel()
                live.update(progress_table(states, base.system))
        console.print()
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    return rows
