"""Discrete-event simulator: workload x decision core x engine profile x backends, in virtual time.

The loop drives the very objects the live system runs: the decision core from
``policies.registry`` (the gateway drives the same one from asyncio) and one ``Engine`` per backend
(the live twin drives the same one from wall-clock sleeps). Nothing sleeps: the next thing to happen
is either the earliest pending event on the heap (a client sends, a trace request arrives, a core
tick, a backend poll) or the end of some engine's current forward pass, whichever comes first.

What the core sees is what the live gateway sends it (``loadtest/sim/driver.py``): the facts
``serve`` computes (token estimates learned from reported usage, no conversation id, the client's
``max_tokens``; the true values only with ``oracle``), every event through ``SimDriver`` (the
dispatcher's twin: arrive, cancel, retry, requeue, wake, first token, release, a tick every
``tick_s`` while requests wait), and the backends as ``backends/pool.py`` sees them (health checks,
``/v1/loads`` every ``refresh_s``, breakers). Optional faults: clients that leave, backends that
go away for a while, team leases held by another replica.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from backends.sim.tokenizer import Block
from loadtest.results.metrics import RequestRecord, summarize, team_rows
from loadtest.sim.config import EngineFactory as EngineFactory
from loadtest.sim.config import EngineLike as EngineLike
from loadtest.sim.config import SimConfig as SimConfig
from loadtest.sim.config import default_engine_factory as default_engine_factory
from loadtest.sim.config import fleet_profiles as fleet_profiles
from loadtest.sim.config import policy_label
from loadtest.sim.live import LivePath, build_core, validate_config
from loadtest.sim.live import _load_config as _load_config
from loadtest.workloads.core import (
    BLOCK_TOKENS,
    TRACE_BLOCK_TOKENS,
    CodingAgent,
    Conversation,
    PromptChain,
    Segment,
    TeamSpec,
    TraceRequest,
    TraceWorkload,
    Workload,
    answer_segment,
    segment_blocks,
    slot_teams,
)
from loadtest.workloads.spec import make_workload
from policies.core import DecisionCore
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse

MODEL = "kimi"


@dataclass(slots=True)
class _Slot:
    """One closed-loop conversation slot: its current conversation and prompt so far."""

    index: int
    team: str
    convs: Iterator[Conversation]
    conv: Conversation
    turn: int = 0
    chain: PromptChain = field(default_factory=PromptChain)


@dataclass(slots=True)
class _Pending:
    record: RequestRecord
    prompt: list[Block]
    final_blocks: list[Block]
    output_tokens: int
    slot: _Slot | None = None
    answer: list[Block] | None = None
    base_len: int = 0
    """Blocks the slot's prompt had before this turn appended its new messages."""
    prompt_bytes: int = 0
    backend: str | None = None
    """Where it was dispatched (None while it waits)."""
    retried: bool = False


_SEND, _ARRIVE, _TICK, _REFRESH, _WARM, _CALL = range(6)


class Simulator(LivePath):
    """One run. ``run()`` returns the records and the engines' retraction count in the window."""

    def __init__(
        self,
        cfg: SimConfig,
        core: DecisionCore,
        engines: dict[str, EngineLike],
        workload: Workload,
        settings: Any = None,
    ) -> None:
        self.cfg = cfg
        self.core = core
        self.engines = engines
        self.workload = workload
        self.end = cfg.minutes * 60.0
        self.warm = min(cfg.warmup_minutes * 60.0, self.end)
        self.records: list[RequestRecord] = []
        self.pending: dict[str, _Pending] = {}
        self.slots: list[_Slot] = []
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._rids = itertools.count()
        self._trace: Iterator[TraceRequest] | None = None
        self._retractions_at_warm = 0
        self.retractions = 0
        self._engine_list = list(engines.values())
        self._engine_index = {name: i for i, name in enumerate(engines)}
        self._due: list[tuple[float, int]] = []
        self._live_path(MODEL, settings)  # the facts, driver and pool of loadtest/sim/live.py

    def _touch(self, i: int) -> None:
        """Engine ``i`` changed: queue its next pass end (older entries become stale)."""
        t = self._engine_list[i].next_time()
        if t is not None:
            heapq.heappush(self._due, (t, i))

    def _touch_backend(self, name: str) -> None:
        self._touch(self._engine_index[name])

    # -- event plumbing -------------------------------------------------------------------------
    def _push(self, t: float, kind: int, data: Any = None) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, data))

    def _retractions(self) -> int:
        return sum(int(e.counters.retractions) for e in self.engines.values())

    def run(self) -> list[RequestRecord]:
        teams = self.cfg.teams or [TeamSpec("default", self.cfg.conversations)]
        self._on_heap(0.0, _REFRESH, None)  # the core knows the backends before anything arrives
        if isinstance(self.workload, CodingAgent):
            for i, team in enumerate(slot_teams(teams), start=self.cfg.first_slot):
                convs = self.workload.conversations(i, team)
                slot = _Slot(i, team, convs, next(convs))
                self.slots.append(slot)
                self._push(slot.conv.turns[0].think_s, _SEND, slot)
        else:
            self._trace = self.workload.requests(teams, until_s=self.end)
            self._next_arrival()
        self._push(self.cfg.tick_s, _TICK)
        self._push(self.warm, _WARM)
        engines = self._engine_list
        due = self._due
        while True:
            # The engine whose pass ends first (lowest index on a tie, as a scan would pick): entries
            # are (time, index), pushed whenever an engine changes; an entry whose time is no longer
            # that engine's next_time() is stale and dropped.
            while due and engines[due[0][1]].next_time() != due[0][0]:
                heapq.heappop(due)
            t_eng = due[0][0] if due else None
            t_heap = self._heap[0][0] if self._heap else None
            if t_eng is not None and (t_heap is None or t_eng <= t_heap):
                if t_eng >= self.end:
                    break
                i = heapq.heappop(due)[1]
                events = engines[i].complete()
                self._touch(i)
                self._on_engine_events(events, t_eng)
                continue
            if t_heap is None or t_heap >= self.end:
                break
            t, _, kind, data = heapq.heappop(self._heap)
            self._on_heap(t, kind, data)
        self.retractions = self._retractions() - self._retractions_at_warm
        return self.records

    def _on_heap(self, now: float, kind: int, data: Any) -> None:
        self.now = now
        if kind == _SEND:
            self._send_turn(data, now)
        elif kind == _ARRIVE:
            self._arrive_trace(data, now)
            self._next_arrival()
        elif kind == _TICK:
            self.driver.tick(now)
            self._push(now + self.cfg.tick_s, _TICK)
        elif kind == _REFRESH:
            if now == 0.0:  # the pool's first health checks, then one every interval
                self._on_heap(now, _CALL, self._health)
            self.pool.poll_loads(now)
            self.pool.pool._changed(MODEL)  # the pool tells the core (once per round here)
            self._push(now + self.cfg.refresh_s, _REFRESH)
        elif kind == _WARM:
            self._retractions_at_warm = self._retractions()
        elif kind == _CALL:
            data(now)
        self._apply([], now)

    def views(self) -> list[BackendView]:
        """The backends as the pool last saw them (``backends/pool.py``'s aggregation)."""
        return self.pool.views()

    # -- requests -------------------------------------------------------------------------------
    _CALL = _CALL

    def _new_rid(self) -> str:
        return f"r{next(self._rids)}"

    def _send_turn(self, slot: _Slot, now: float) -> None:
        conv = slot.conv
        turn = conv.turns[slot.turn]
        base_len = len(slot.chain.blocks)
        for seg in turn.new:
            slot.chain.extend(seg)
        prompt = list(slot.chain.blocks)
        answer = _append_blocks(prompt, conv.answer_segment(slot.turn).pieces, BLOCK_TOKENS)
        rid = self._new_rid()
        rec = RequestRecord(rid, team=slot.team, slot=slot.index, arrival=now)
        self._submit_facts(
            _Pending(rec, prompt, prompt + answer, turn.output_tokens, slot, answer, base_len), conv.cid, now
        )

    def _next_arrival(self) -> None:
        assert self._trace is not None
        req = next(self._trace, None)
        if req is not None:
            self._push(req.arrival_s, _ARRIVE, req)

    def _arrive_trace(self, req: TraceRequest, now: float) -> None:
        prompt = segment_blocks(req.prompt, TRACE_BLOCK_TOKENS)
        answer = _append_blocks(
            prompt, answer_segment(f"{req.rid}/answer", req.output_tokens).pieces, TRACE_BLOCK_TOKENS
        )
        rec = RequestRecord(req.rid, team=req.team, arrival=now)
        self._submit_facts(_Pending(rec, prompt, prompt + answer, req.output_tokens), None, now)

    def _submit_facts(self, p: _Pending, conversation: str | None, now: float) -> None:
        self.records.append(p.record)
        self.pending[p.record.rid] = p
        p.record.prompt_tokens = sum(n for _, n in p.prompt)
        facts, p.prompt_bytes = self.facts.facts(
            p.record.rid, MODEL, p.record.team, p.prompt, p.output_tokens, conversation
        )
        f = self.cfg.faults
        if f.cancel_rate and self._faults.random() < f.cancel_rate:
            self._push(
                now + self._faults.uniform(0.0, f.cancel_within_s),
                _CALL,
                functools.partial(self._client_left, p.record.rid),
            )
        self.driver.arrive(facts, now)

    def _apply(self, decisions: list[Decision], now: float) -> None:
        """Carry out the core's decisions (``decisions`` and those the driver queued) in order."""
        queue = self._decided
        queue.extend(decisions)
        while queue:
            d = queue.popleft()
            p = self.pending.get(d.rid)
            if p is None:
                continue
            if isinstance(d, Dispatch):
                self._dispatch(p, d, now)
            elif isinstance(d, Refuse):
                self._refused(p, d, now)

    def _refused(self, p: _Pending, d: Refuse, now: float) -> None:
        del self.pending[p.record.rid]
        p.record.error = d.code
        p.record.ok = False
        p.record.finish = now
        if p.slot is not None:  # the client retries the same turn after Retry-After
            del p.slot.chain.blocks[p.base_len :]
            self._push(now + max(1.0, d.retry_after_s), _SEND, p.slot)

    def _on_engine_events(self, events: list[Any], now: float, *, apply: bool = True) -> list[Decision]:
        decisions: list[Decision] = []
        self.now = now
        for ev in events:
            p = self.pending.get(ev.rid)
            if p is None:
                continue
            rec = p.record
            if ev.kind == "first_token":
                if rec.first_token is None:
                    rec.first_token = ev.time
                self.driver.first_token(ev.rid, ev.time)
                continue
            del self.pending[ev.rid]
            ok = ev.finish_reason != "abort"
            self.pool.answered(ev.rid, rec.first_token if ok else None, ev.prompt_tokens, ev.cached_tokens)
            rec.finish = ev.time
            rec.prompt_tokens = ev.prompt_tokens
            rec.cached_tokens = ev.cached_tokens
            rec.output_tokens = ev.completion_tokens
            rec.ok = ev.finish_reason != "abort"
            if not rec.ok:
                rec.error = "abort"
            if rec.ok:
                self.facts.observe(p.prompt_bytes, ev.prompt_tokens)
                if p.backend is not None:
                    self.pool.request_ok(p.backend)
            self.driver.release(
                ev.rid,
                Outcome(
                    ok=rec.ok,
                    prompt_tokens=ev.prompt_tokens,
                    completion_tokens=ev.completion_tokens,
                    cached_tokens=ev.cached_tokens,
                ),
                ev.time,
            )
            if p.slot is not None:
                self._next_turn(p, ev.time)
        if apply:
            self._apply(decisions, now)
            return []
        return decisions

    def _next_turn(self, p: _Pending, now: float) -> None:
        slot = p.slot
        assert slot is not None and p.answer is not None
        slot.chain.blocks.extend(p.answer)
        slot.turn += 1
        if slot.turn >= len(slot.conv.turns):
            slot.conv = next(slot.convs)
            slot.turn = 0
            slot.chain = PromptChain()
        self._push(now + slot.conv.turns[slot.turn].think_s, _SEND, slot)


def _append_blocks(prompt: list[Block], pieces: tuple[tuple[str, int], ...], block_tokens: int) -> list[Block]:
    """Blocks that ``pieces`` add after ``prompt`` (chained from its last key)."""
    chain = PromptChain(block_tokens)
    chain.blocks = prompt[-1:]
    chain.extend(Segment("assistant", pieces))
    return chain.blocks[1:] if prompt else chain.blocks


# -- building a run ------------------------------------------------------------------------------


def run_one(cfg: SimConfig, *, engine_factory: EngineFactory | None = None, core: DecisionCore | None = None) -> dict:
    """One simulated run -> one JSON row (``loadtest/results/metrics.py::summarize``'s fields, plus ``kv_tokens``,
    ``unbounded``, ``oracle``, ``warm_start`` and, with faults, ``faults``)."""
    config = _load_config(cfg.config)
    core = core or build_core(cfg.policy, cfg.admission, cfg.routing, config)
    factory = engine_factory or default_engine_factory(cfg)
    engines = {f"b{i}": factory() for i in range(cfg.backends)}
    if cfg.cache_view == "precise":
        from loadtest.sim.kv_view import attach_precise_view

        attach_precise_view(core, engines)
    workload = make_workload(
        cfg.workload,
        seed=cfg.seed,
        scale=cfg.scale,
        think_scale=cfg.think_scale,
        speedup=cfg.speedup,
        warm_start=cfg.warm_start,
    )
    sim = Simulator(cfg, core, engines, workload, validate_config(config) if config is not None else None)
    records = sim.run()
    teams = cfg.teams or [TeamSpec("default", cfg.conversations)]
    closed = isinstance(workload, CodingAgent)
    slots = {s.index: s.team for s in sim.slots} if closed else None
    window = summarize(records, sim.warm, sim.end, slots=slots, backends=list(engines))
    first = next(iter(engines.values()))
    row: dict[str, Any] = {
        "policy": policy_label(cfg),
        "profile": cfg.profile,
        "backends": cfg.backends,
        "workload": workload.name,
        "seed": cfg.seed,
        "minutes": cfg.minutes,
        "conversations": sum(t.conversations for t in teams) if closed else None,
    }
    row.update(window)
    row["retractions"] = sim.retractions
    row["teams"] = team_rows(records, sim.warm, sim.end, {t.name: t.conversations for t in teams})
    if not closed:  # open loop: teams are request shares, not conversations
        for team in row["teams"].values():
            team["conversations"] = None
    row["kv_tokens"] = None if cfg.unbounded else first.max_total_num_tokens
    row["unbounded"] = cfg.unbounded
    row["oracle"] = cfg.oracle
    row["warm_start"] = cfg.warm_start
    row["cache_view"] = cfg.cache_view
    if cfg.faults.any:
        row["faults"] = sim.fault_counts()
    return row


__all__ = ["SimConfig", "Simulator", "TraceWorkload", "build_core", "run_one"]
