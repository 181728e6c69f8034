"""The simulator runs the live path: the facts serve computes, the pool's view of the backends, and
faults (clients that leave, a backend that goes away, leases held elsewhere) with nothing lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from backends.sim.engine import Engine, RankLoad
from backends.sim.profiles import get_profile
from loadtest.sim.driver import Faults, LiveFacts, SimPool, parse_unhealthy
from loadtest.sim.simulate import SimConfig, Simulator, build_core, default_engine_factory
from loadtest.workloads.spec import make_workload
from policies.core import DecisionCore
from policies.types import RequestFacts


def _run(cfg: SimConfig, core: DecisionCore | None = None) -> tuple[Simulator, list[RequestFacts]]:
    core = core or build_core(cfg.policy)
    seen: list[RequestFacts] = []
    arrive = core.arrive

    def spy(facts: RequestFacts, now: float) -> Any:
        seen.append(facts)
        return arrive(facts, now)

    core.arrive = spy  # type: ignore[method-assign]
    factory = default_engine_factory(cfg)
    engines = {f"b{i}": factory() for i in range(cfg.backends)}
    sim = Simulator(cfg, core, engines, make_workload(cfg.workload, seed=cfg.seed, scale=cfg.scale))
    sim.run()
    return sim, seen


BASE = {
    "profile": "tiny",
    "backends": 2,
    "policy": "gateway",
    "conversations": 12,
    "minutes": 4,
    "warmup_minutes": 0.5,
    "scale": 0.04,
}


def test_the_core_gets_what_serve_knows_unless_the_oracle_is_asked_for() -> None:
    _, live = _run(SimConfig(**BASE, max_tokens=2048))
    assert live and all(f.conversation is None and f.max_output_tokens == 2048 for f in live)
    _, oracle = _run(SimConfig(**BASE, oracle=True))
    assert all(f.conversation is not None for f in oracle)
    assert len({f.max_output_tokens for f in oracle}) > 5  # each turn's true output length


def test_token_estimates_follow_the_ratio_learned_from_reported_usage() -> None:
    facts = LiveFacts(bytes_per_token=3)  # the engine's tokens are 3 bytes; the estimator starts at 4
    blocks = [(i, 500) for i in range(10)]
    first, size = facts.facts("r", "m", "t", blocks, 100, None)
    assert size == 15_000 and first.prompt_tokens == 3750  # 15 kB at 0.25 tokens per byte
    for _ in range(200):
        facts.observe(size, 5000)  # the backend reports the true 5000
    later, _ = facts.facts("r2", "m", "t", blocks, 100, None)
    assert later.prompt_tokens == pytest.approx(5000, rel=0.01)
    assert [k for k, _ in later.fingerprint] == list(range(10)) and first.max_output_tokens == 0


@dataclass
class _TwoRanks:
    dp_size: int = 2
    max_total_num_tokens: int = 1000

    def loads(self) -> list[RankLoad]:
        return [RankLoad(0, 3, 1, 200, 1000, 0.2, 0.5, 0.0, 64), RankLoad(1, 1, 2, 800, 1000, 0.8, 0.1, 0.0, 64)]


def test_the_pool_view_is_the_live_pools_aggregation_on_the_virtual_clock() -> None:
    now = [0.0]
    pool = SimPool("m", {"b0": _TwoRanks()}, lambda: now[0], unhealthy=[("b0", 10.0, 20.0)])
    pool.check_health(0.0)
    pool.poll_loads(0.0)
    (view,) = pool.views()
    assert (view.healthy, view.running, view.waiting, view.token_usage, view.dp_size) == (True, 4, 3, 0.8, 2)
    now[0] = 10.0
    pool.request_failed("b0", "connect")  # a refused connection opens the breaker at once
    assert not pool.views()[0].healthy
    for t in (12.0, 14.0):
        pool.check_health(t)
    now[0] = 40.0
    pool.check_health(40.0)  # back, and the breaker's half-open probe passes
    assert pool.views()[0].healthy


def test_the_pool_reads_a_simulated_engines_running_cap_and_host_tier_as_admission_needs_them() -> None:
    profile = get_profile("b300-tp8-fp8-hicache")
    assert profile.host_tier_tokens > 0 and profile.max_running_requests > 0
    pool = SimPool("m", {"b0": Engine(profile), "b1": Engine(profile, unbounded=True)}, lambda: 0.0)
    pool.check_health(0.0)
    tiered, unbounded = pool.views()
    assert (tiered.max_running_requests, tiered.host_tokens, tiered.reload_tokens_per_s) == (
        profile.max_running_requests,
        profile.host_tier_tokens,
        profile.host_load_tokens_per_s,
    )
    # An unbounded engine is the ceiling: no cap and no tier to size seats with.
    assert (unbounded.max_running_requests, unbounded.host_tokens, unbounded.reload_tokens_per_s) == (0, 0, 0.0)


def test_faults_are_exercised_and_nothing_is_lost() -> None:
    faults = Faults(
        cancel_rate=0.1,
        cancel_within_s=5.0,
        unhealthy=(("b1", 60.0, 120.0), ("b0", 150.0, 170.0)),
        lease_refusal_rate=0.2,
    )
    sim, _ = _run(SimConfig(**{**BASE, "scale": 0.1}, faults=faults))
    counts = sim.fault_counts()
    assert counts["cancelled"] > 0 and counts["stream_broken"] > 0 and counts["requeues"] > 0
    assert any(r.backend == "b1" and r.ok and r.arrival > 180 for r in sim.records)  # both are used again
    assert any(r.backend == "b0" and r.ok and r.arrival > 180 for r in sim.records)
    # Everything a request took is given back: the core holds exactly the requests still in flight.
    snapshot = sim.core.snapshot()
    in_flight = sum(1 for p in sim.pending.values() if p.backend is not None)
    assert snapshot["running"] == in_flight and snapshot["waiting"] == sim.driver.waiting
    assert sum(1 for r in sim.records if r.ok) > 100


def test_a_bad_simulator_config_is_refused_as_serve_refuses_it() -> None:
    with pytest.raises(ValueError, match="tie_rel"):
        build_core("gateway", config={"router": {"tie_rel": -1}})
    with pytest.raises(ValueError, match="START"):
        parse_unhealthy("b0:30")
