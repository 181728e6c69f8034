"""``min-ttft``'s view of load (DP ranks, the learned prefill rate, reported and failed requests),
the ``least-load`` balancer, and the routing registry."""

from __future__ import annotations

from collections import Counter

import pytest

from policies import registry
from policies.core import PassThroughCore
from policies.routers import LeastLoad, MinTTFT
from policies.types import BackendView, Dispatch, Outcome
from tests.policies.routing_helpers import SYSTEM, chain, req, send, views, warm_up_common

# -- min-ttft: load --------------------------------------------------------------------------------


def test_dp_ranks_are_pinned_per_conversation() -> None:
    router, backends = MinTTFT(), views(1, dp=8, kv=4_900_000)
    warm_up_common(router, backends)
    convs = {f"c{i}": chain(f"dp{i}", 30_000, SYSTEM) for i in range(24)}
    ranks: dict[str, set[int]] = {c: set() for c in convs}
    for turn in range(6):
        for c, fp in convs.items():
            fp = convs[c] = chain(f"{c}/t{turn}", 2500, fp)
            d = send(router, req(f"{c}-{turn}", fp, c), backends, 10.0 * turn + 0.1)
            assert d.backend == "b0" and d.rank is not None and 0 <= d.rank < 8
            ranks[c].add(d.rank)
    assert all(len(r) == 1 for r in ranks.values())
    per_rank = Counter(next(iter(r)) for r in ranks.values())
    assert len(per_rank) == 8 and max(per_rank.values()) <= 5


def test_no_rank_for_a_backend_without_dp() -> None:
    router = MinTTFT()
    d = router.route(req("r", chain("x", 5000)), views(2), 0.0)
    assert d is not None and d.rank is None


def test_prefill_rate_is_learned_from_first_tokens() -> None:
    router, backends = MinTTFT(), views(1)
    model_s = router.model.seconds(40_000, 0)
    for i in range(30):  # the backend is twice as slow as the configured model
        r = req(f"r{i}", chain(f"slow{i}", 40_000))
        d = router.route(r, backends, 100.0 * i)
        assert d is not None
        router.dispatched(r, d, 100.0 * i)
        router.first_token(r.rid, 100.0 * i + 2 * model_s)
        router.finished(r.rid, "b0", Outcome(prompt_tokens=40_000, cached_tokens=0), 100.0 * i + 5)
    assert router.speed["b0"] == pytest.approx(0.5, rel=0.1)
    d = router.route(req("x", chain("fresh", 40_000)), backends, 10_000.0)
    assert d is not None and d.scores["expected_ttft_s"] == pytest.approx(2 * model_s, rel=0.1)


def test_reported_load_beyond_ours_counts() -> None:
    router = MinTTFT()
    quiet = BackendView(name="b0", kv_tokens=5_000_000)
    busy = BackendView(name="b1", kv_tokens=5_000_000, running=30, waiting=20)
    picks = Counter()
    for i in range(20):
        d = router.route(req(f"r{i}", chain(f"cold{i}", 20_000)), [busy, quiet], 0.0)
        assert d is not None
        picks[d.backend] += 1
    assert picks["b0"] == 20


def test_a_late_report_of_our_own_finished_requests_is_not_counted_twice() -> None:
    router = MinTTFT()
    for i in range(6):
        r = req(f"r{i}", chain(f"x{i}", 20_000))
        router.dispatched(r, Dispatch(r.rid, "b1", None, "least_wait"), 0.0)
    for i in range(6):
        router.first_token(f"r{i}", 1.0)
        router.finished(f"r{i}", "b1", Outcome(), 1.0)
    stale = BackendView(name="b1", kv_tokens=5_000_000, running=6)  # polled before they finished
    assert router._surplus(stale, 1.5) == (0.0, 0.0)
    assert router._surplus(stale, 10.0)[0] == 6.0  # still reported long after: someone else's


def test_failed_dispatch_frees_the_slot() -> None:
    router, backends = MinTTFT(), views(2)
    r = req("r", chain("x", 50_000))
    d = send(router, r, backends, 0.0, finish=False)
    router.finished("r", d.backend, Outcome(ok=False, reached_backend=False), 0.1)
    assert router._slots[(d.backend, None)].inflight == 0
    assert router._slots[(d.backend, None)].pending == set()


# -- least-load ------------------------------------------------------------------------------------


def test_least_load_counts_its_own_dispatches_and_breaks_ties_at_random() -> None:
    backends = views(3)
    router = LeastLoad(seed=1)
    firsts = Counter()
    for i in range(60):
        d = router.route(req(f"t{i}", ()), backends, 0.0)
        assert d is not None and d.reason == "least_wait"
        firsts[d.backend] += 1
    assert len(firsts) == 3  # ties are not always the first backend
    placed = Counter()
    for i in range(30):
        d = send(router, req(f"r{i}", ()), backends, 0.0, finish=False)
        placed[d.backend] += 1
    assert sorted(placed.values()) == [10, 10, 10]
    router.finished("r0", "ignored", Outcome(), 1.0)
    freed = [b for b in placed if router._inflight.per_backend[b] == 9]
    d = router.route(req("next", ()), backends, 1.0)
    assert d is not None and [d.backend] == freed


def test_least_load_routes_to_ranks() -> None:
    router = LeastLoad()
    ranks = Counter()
    for i in range(16):
        d = send(router, req(f"r{i}", ()), views(1, dp=8), 0.0, finish=False)
        ranks[d.rank] += 1
    assert ranks == Counter({r: 2 for r in range(8)})


# -- registry --------------------------------------------------------------------------------------


def test_registry_stacks_and_routing_overrides() -> None:
    assert {"direct", "round-robin", "least-load", "sglang-cache-aware", "gateway"} <= set(registry.names())
    assert {"direct", "round-robin", "least-load", "sglang-cache-aware", "min-ttft"} <= set(registry.routing_names())
    gw = registry.build("gateway")
    assert isinstance(gw.router, MinTTFT) and gw.name == "gateway"  # whatever admission sits above it
    for name in ("least-load", "sglang-cache-aware"):
        core = registry.build(name)
        assert isinstance(core, PassThroughCore) and core.router.name == name
    over = registry.build("round-robin", routing="min-ttft")
    assert isinstance(over, PassThroughCore) and over.name == "round-robin" and isinstance(over.router, MinTTFT)
    assert registry.build("gateway").router is not gw.router  # fresh state per build
    with pytest.raises(ValueError, match="unknown routing"):
        registry.build("gateway", routing="nope")


def test_min_ttft_routes_through_the_pass_through_core() -> None:
    core = registry.build("least-load", routing="min-ttft")
    core.set_backends("m", views(3), 0.0)
    fp = chain("c/t1", 20_000, SYSTEM)
    [d] = core.arrive(req("a", fp), 0.0)
    assert isinstance(d, Dispatch)
    core.first_token("a", 0.5)
    core.finish("a", Outcome(prompt_tokens=20_000), 2.0)
    [d2] = core.arrive(req("b", chain("c/t2", 2000, fp)), 10.0)
    assert isinstance(d2, Dispatch) and d2.backend == d.backend and d2.reason == "prefix"
    [retry] = core.retry("b", d2.backend, 10.1)
    assert isinstance(retry, Dispatch) and retry.backend != d2.backend and retry.reason == "retry"


def test_dp_pinning_reaches_the_ranks_cache_in_the_simulator() -> None:
    # The simulator hands Dispatch.rank to the engine as routed_dp_rank: pinned conversations
    # find their prefix in their rank's cache; the server's own round-robin over ranks does not.
    from loadtest.sim.simulate import SimConfig, run_one

    cfg = dict(profile="b300-dp8-fp8", backends=1, conversations=8, minutes=4, warmup_minutes=1)
    pinned = run_one(SimConfig(policy="round-robin", routing="min-ttft", **cfg))
    direct = run_one(SimConfig(policy="direct", **cfg))
    assert pinned["cache_hit_rate"] > 0.9 > direct["cache_hit_rate"] + 0.2
