"""The discrete-event loop, driven with a small stand-in engine (the real one has its own tests;
``test_sim_engine.py`` runs the loop against it)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backends.sim.engine import EngineCounters, EngineEvent, RankLoad
from loadtest.sim.simulate import SimConfig, Simulator, build_core, run_one
from loadtest.workloads.core import CodingAgent, parse_teams
from loadtest.workloads.spec import make_workload


@dataclass
class _Req:
    rid: str
    prompt: list
    final: list
    output: int
    cached: int = 0
    generated: int = 0


@dataclass
class StandInEngine:
    """One request prefills at a time (1 ms + 10 µs per uncached token), then all running requests
    decode one token per 10 ms step. The cache is an unbounded set of chained block keys."""

    dp_size: int = 1
    max_total_num_tokens: int = 1_000_000
    counters: EngineCounters = field(default_factory=EngineCounters)
    cache: set = field(default_factory=set)
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    busy_until: float | None = None
    pass_kind: str = ""
    submits: list = field(default_factory=list)

    def submit(self, req, now: float) -> None:
        self.submits.append((now, req.rid, req.dp_rank))
        self.waiting.append(_Req(req.rid, req.prompt, req.final_blocks, req.output_tokens))
        if self.busy_until is None:
            self._start(now)

    def _start(self, now: float) -> None:
        if self.waiting:
            r = self.waiting[0]
            hit = 0
            for key, n in r.prompt:
                if key not in self.cache:
                    break
                hit += n
            r.cached = hit
            total = sum(n for _, n in r.prompt)
            self.busy_until, self.pass_kind = now + 0.001 + 1e-5 * (total - hit), "prefill"
        elif self.running:
            self.busy_until, self.pass_kind = now + 0.01, "decode"
        else:
            self.busy_until = None

    def next_time(self) -> float | None:
        return self.busy_until

    def complete(self) -> list[EngineEvent]:
        now = self.busy_until
        assert now is not None
        events = []
        if self.pass_kind == "prefill":
            r = self.waiting.pop(0)
            r.generated = 1
            events.append(EngineEvent("first_token", r.rid, now))
            self.running.append(r)
        else:
            for r in self.running:
                r.generated += 1
        for r in [r for r in self.running if r.generated >= r.output]:
            self.running.remove(r)
            self.cache.update(k for k, _ in r.final)
            total = sum(n for _, n in r.prompt)
            self.counters.prompt_tokens += total
            events.append(
                EngineEvent(
                    "finished",
                    r.rid,
                    now,
                    prompt_tokens=total,
                    completion_tokens=r.generated,
                    cached_tokens=r.cached,
                    finish_reason="length",
                )
            )
        self._start(now)
        return events

    def advance(self, until: float) -> list[EngineEvent]:
        events = []
        while self.busy_until is not None and self.busy_until <= until:
            events += self.complete()
        return events

    def loads(self) -> list[RankLoad]:
        return [RankLoad(0, len(self.running), len(self.waiting), 0, self.max_total_num_tokens, 0.0, 0.0, 0.0, 64)]


def _sim(cfg: SimConfig, engines: int = 1) -> tuple[Simulator, dict]:
    eng = {f"b{i}": StandInEngine() for i in range(engines)}
    sim = Simulator(
        cfg,
        build_core(cfg.policy),
        eng,
        make_workload(cfg.workload, seed=cfg.seed, scale=cfg.scale, think_scale=cfg.think_scale, speedup=cfg.speedup),
    )
    sim.run()
    return sim, eng


def test_closed_loop_resends_history_and_hits_cache() -> None:
    cfg = SimConfig("stand-in", conversations=3, minutes=2, warmup_minutes=0, scale=0.05)
    sim, _engines = _sim(cfg)
    recs = [r for r in sim.records if r.finish is not None]
    assert len(recs) > 20
    # each slot's requests are strictly sequential with a 2-8 s think pause between them
    for slot in range(3):
        mine = [r for r in sim.records if r.slot == slot]
        for prev, nxt in itertools.pairwise(mine):
            assert prev.finish is not None and 2.0 <= nxt.arrival - prev.finish <= 8.0 + 1e-9
    later = [r for r in recs if r.cached_tokens > 0]
    assert len(later) >= len(recs) - 3  # every turn after the first hits its history (and the prefix)
    hit = sum(r.cached_tokens for r in recs) / sum(r.prompt_tokens for r in recs)
    assert hit > 0.9
    # the prompts the engine saw are the workload's: first turn of slot 0 is prefix + task
    conv = CodingAgent(seed=1, scale=0.05).conversation(0, 0)
    first = next(r for r in sim.records if r.slot == 0)
    assert first.prompt_tokens == sum(s.tokens for s in conv.turns[0].new)
    assert first.arrival == pytest.approx(conv.turns[0].think_s)


def test_runs_are_deterministic_and_round_robin_spreads() -> None:
    cfg = SimConfig("stand-in", backends=2, conversations=4, minutes=1, warmup_minutes=0, scale=0.05)
    a, ea = _sim(cfg, 2)
    b, _ = _sim(cfg, 2)
    key = [(r.rid, r.arrival, r.first_token, r.finish, r.backend) for r in a.records]
    assert key == [(r.rid, r.arrival, r.first_token, r.finish, r.backend) for r in b.records]
    assert len(ea["b0"].submits) - len(ea["b1"].submits) in (0, 1)


def test_trace_open_loop_keeps_arrivals(tmp_path: Path) -> None:
    rows = [{"timestamp": t * 1000, "input_length": 600, "output_length": 3, "hash_ids": [0, t + 1]} for t in range(10)]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = SimConfig(
        "stand-in", workload=f"trace:{path}", minutes=1, warmup_minutes=0, speedup=2.0, teams=parse_teams("x:1,y:1")
    )
    sim, _ = _sim(cfg)
    assert [r.arrival for r in sim.records] == [t / 2 for t in range(10)]
    assert all(r.finish is not None for r in sim.records)
    assert sum(r.cached_tokens for r in sim.records) == 9 * 512  # block 0 is shared
    assert {r.team for r in sim.records} == {"x", "y"}


def test_run_one_row_fields() -> None:
    cfg = SimConfig(
        "stand-in",
        backends=2,
        conversations=4,
        minutes=1.5,
        warmup_minutes=0.5,
        scale=0.05,
        teams=parse_teams("a:3,b:1"),
    )
    row = run_one(cfg, engine_factory=StandInEngine)
    for f in (
        "policy",
        "profile",
        "backends",
        "workload",
        "seed",
        "minutes",
        "conversations",
        "total_tpm",
        "input_tpm",
        "cached_tpm",
        "output_tpm",
        "completed_rpm",
        "ttft_p50_s",
        "ttft_p95_s",
        "output_tps_p50",
        "cache_hit_rate",
        "load_imbalance",
        "errors",
        "retractions",
        "teams",
        "max_wait_s",
        "starved",
    ):
        assert f in row, f
    assert row["conversations"] == 4 and row["starved"] == 0 and row["errors"] == 0
    assert set(row["teams"]) == {"a", "b"} and row["teams"]["a"]["conversations"] == 3
    assert (
        row["total_tpm"] == row["input_tpm"] + row["output_tpm"]
        or abs(row["total_tpm"] - row["input_tpm"] - row["output_tpm"]) <= 1
    )
    assert 1.0 <= row["load_imbalance"] < 1.5


def test_unknown_policy_and_overrides() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        build_core("nope")
    with pytest.raises(ValueError, match="unknown admission"):
        build_core("direct", admission="nope")
    with pytest.raises(ValueError, match="unknown routing"):
        build_core("direct", routing="nope")
