"""The product router ``min-ttft`` (policies/routers/min_ttft.py), the ``least-load`` balancer, and
the routing registry."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from policies import registry
from policies.core import PassThroughCore
from policies.routers import CommonBlocks, LeastLoad, MinTTFT
from policies.routers.base import mix64, stable_hash
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts

REASONS = {"prefix", "cold_hash", "least_wait", "imbalance", "retry"}
BLOCK = 1024


def chain(label: str, tokens: int, parent: Fingerprint = ()) -> Fingerprint:
    """Chained blocks of ``tokens`` tokens after ``parent`` (keys stable across processes)."""
    out = list(parent)
    for i in range(0, tokens, BLOCK):
        prev = out[-1][0] if out else 0
        out.append((mix64(prev ^ stable_hash(f"{label}#{i}")), min(BLOCK, tokens - i)))
    return tuple(out)


SYSTEM = chain("system", 15_000)


def req(rid: str, fp: Fingerprint, conversation: str | None = None) -> RequestFacts:
    return RequestFacts(
        rid=rid, model="m", prompt_tokens=sum(n for _, n in fp), fingerprint=fp, conversation=conversation
    )


def views(n: int, dp: int = 1, kv: int = 5_000_000) -> list[BackendView]:
    return [BackendView(name=f"b{i}", kv_tokens=kv, dp_size=dp) for i in range(n)]


def send(
    router: MinTTFT | LeastLoad,
    r: RequestFacts,
    backends: list[BackendView],
    now: float,
    *,
    finish: bool = True,
    ttft: float = 0.3,
) -> Dispatch:
    d = router.route(r, backends, now)
    assert d is not None and d.reason in REASONS
    router.dispatched(r, d, now)
    if finish:
        router.first_token(r.rid, now + ttft)
        router.finished(r.rid, d.backend, Outcome(prompt_tokens=r.prompt_tokens), now + ttft + 1)
    return d


def warm_up_common(router: MinTTFT, backends: list[BackendView]) -> None:
    """Two conversations share the system prompt, so it becomes a known branch point."""
    for i in range(2):
        send(router, req(f"w{i}", chain(f"warm{i}", 5000, SYSTEM)), backends, 0.0)


# -- min-ttft ------------------------------------------------------------------------------------


def test_next_turn_goes_to_the_holder() -> None:
    router, backends = MinTTFT(), views(4)
    warm_up_common(router, backends)
    turn1 = chain("c1/t1", 30_000, SYSTEM)
    first = send(router, req("c1a", turn1), backends, 1.0)
    assert first.reason == "cold_hash"
    for k in range(2, 6):
        turn1 = chain(f"c1/t{k}", 3000, turn1)
        d = send(router, req(f"c1-{k}", turn1), backends, float(k * 10))
        assert d.backend == first.backend and d.reason == "prefix"
        assert d.scores["matched_tokens"] > d.scores["common_tokens"] >= 15_000
        assert d.scores["expected_ttft_s"] < 1.0
        assert f"ttft_s:{d.backend}@0" in d.scores


def test_an_overloaded_holder_is_avoided() -> None:
    router, backends = MinTTFT(gate_slack=100), views(3)  # gate out of the way: the wait decides
    warm_up_common(router, backends)
    conv = chain("c/t1", 30_000, SYSTEM)
    holder = send(router, req("c1", conv), backends, 1.0).backend
    # Queue 20 full 150k-token prefills on the holder (no first token yet): minutes of work.
    for i in range(20):
        big = req(f"big{i}", chain(f"big{i}", 150_000))
        router.dispatched(big, Dispatch(big.rid, holder, None, "least_wait"), 2.0)
    nxt = chain("c/t2", 3000, conv)
    d = router.route(req("c2", nxt), backends, 3.0)
    assert d is not None and d.backend != holder and d.reason == "least_wait"
    assert d.scores["matched_tokens"] < d.scores["best_match_tokens"]
    # Once the holder's queue drains (first tokens), the conversation goes home again.
    for i in range(20):
        router.first_token(f"big{i}", 4.0)
        router.finished(f"big{i}", holder, Outcome(), 5.0)
    d = router.route(req("c3", nxt), backends, 6.0)
    assert d is not None and d.backend == holder and d.reason == "prefix"


def test_imbalance_gate_overrides_the_holder() -> None:
    router, backends = MinTTFT(), views(4)
    warm_up_common(router, backends)
    conv = chain("c/t1", 30_000, SYSTEM)
    holder = send(router, req("c1", conv), backends, 1.0).backend
    # Many short requests in flight on the holder (already past prefill: no queued prefill).
    for i in range(12):
        r = req(f"s{i}", chain(f"s{i}", 500))
        router.dispatched(r, Dispatch(r.rid, holder, None, "least_wait"), 2.0)
        router.first_token(r.rid, 2.1)
    d = router.route(req("c2", chain("c/t2", 3000, conv)), backends, 3.0)
    assert d is not None and d.backend != holder and d.reason == "imbalance"
    # Not overloaded relative to the others (they are as busy): the holder is used.
    for b in backends:
        if b.name != holder:
            for i in range(12):
                r = req(f"o{b.name}{i}", chain(f"o{b.name}{i}", 500))
                router.dispatched(r, Dispatch(r.rid, b.name, None, "least_wait"), 2.0)
                router.first_token(r.rid, 2.1)
    d = router.route(req("c3", chain("c/t2", 3000, conv)), backends, 3.0)
    assert d is not None and d.backend == holder and d.reason == "prefix"


def test_a_queue_moves_a_cheap_conversation_not_a_costly_one() -> None:
    """A warm request leaves its cache only when the queue there costs more than ``stay`` × the
    prefill it would add elsewhere: 8 s of queued prefill moves a 2k-token conversation, not a
    200k-token one (its recompute would take ~17 s, and the next turn would find two half-caches)."""
    router, backends = MinTTFT(), views(4)
    warm_up_common(router, backends)
    small = chain("small/t1", 2000, SYSTEM)
    big = chain("big/t1", 200_000, SYSTEM)
    for name, fp in (("small", small), ("big", big)):
        r = req(name, fp)
        router.dispatched(r, Dispatch(r.rid, "b0", None, "prefix"), 1.0)
        router.first_token(r.rid, 1.1)
        router.finished(r.rid, "b0", Outcome(), 1.2)
    for i in range(3):  # ~8 s of prefill queued on b0 (no first token yet)
        r = req(f"q{i}", chain(f"q{i}", 60_000))
        router.dispatched(r, Dispatch(r.rid, "b0", None, "least_wait"), 2.0)
    d_small = router.route(req("s2", chain("small/t2", 1000, small)), backends, 2.0)
    d_big = router.route(req("b2", chain("big/t2", 1000, big)), backends, 2.0)
    assert d_small is not None and d_small.backend != "b0" and d_small.reason == "least_wait"
    assert d_big is not None and d_big.backend == "b0" and d_big.reason == "prefix"


def test_near_ties_are_broken_at_random() -> None:
    backends = views(4)
    picks: Counter[str] = Counter()
    router = MinTTFT(seed=7)
    warm_up_common(router, backends)
    conv = chain("c/t1", 30_000, SYSTEM)
    # Two backends hold the same conversation prefix (e.g. after a failover); nothing is queued.
    for name in ("b1", "b3"):
        r = req(f"seed-{name}", conv)
        router.dispatched(r, Dispatch(r.rid, name, None, "prefix"), 1.0)
        router.first_token(r.rid, 1.2)
        router.finished(r.rid, name, Outcome(), 1.5)
    nxt = req("n", chain("c/t2", 2000, conv))
    for _ in range(200):
        d = router.route(nxt, backends, 2.0)
        assert d is not None
        picks[d.backend] += 1
    assert set(picks) == {"b1", "b3"} and min(picks.values()) > 60
    # Seeded: the same seed gives the same sequence.
    a, b = MinTTFT(seed=3), MinTTFT(seed=3)
    assert [a._rng.random() for _ in range(5)] == [b._rng.random() for _ in range(5)]


def test_shared_system_prompt_does_not_dominate() -> None:
    router, backends = MinTTFT(), views(8)
    placed: Counter[str] = Counter()
    rng = random.Random(1)
    for i in range(400):
        system = (SYSTEM, chain("system2", 12_000), chain("system3", 9000))[i % 3]
        d = send(router, req(f"c{i}", chain(f"conv{i}", rng.randint(5000, 45_000), system)), backends, float(i))
        placed[d.backend] += 1
    assert len(placed) == 8
    assert max(placed.values()) <= 1.5 * 400 / 8
    assert CommonBlocks().prefix_blocks(SYSTEM) == 0  # a fresh router knows nothing is common


def test_common_blocks_are_branch_points() -> None:
    common = CommonBlocks()
    a = chain("a", 5000, SYSTEM)
    common.observe(a)
    assert common.prefix_blocks(a) == 0  # one conversation: nothing shared yet
    a2 = chain("a2", 3000, a)
    common.observe(a2)  # the same conversation's next turn is no branch
    assert common.prefix_blocks(a2) == 0
    common.observe(chain("b", 5000, SYSTEM))
    assert common.prefix_blocks(a2) == len(SYSTEM)


def test_the_first_reuse_of_a_system_prompt_is_already_common() -> None:
    """The request being routed brings the second successor itself: a second conversation on a system
    prompt is cold (else it follows the first conversation to its backend, every new gateway in front
    of slow engines piling each assistant's conversations on one)."""
    common = CommonBlocks()
    a = chain("a", 5000, SYSTEM)
    common.observe(a)
    assert common.prefix_blocks(chain("b", 5000, SYSTEM)) == len(SYSTEM)
    assert common.prefix_blocks(chain("a2", 3000, a)) == 0  # a's next turn continues its one chain


def test_a_filled_last_block_is_growth_not_a_branch() -> None:
    """The gateway cuts bytes into fixed blocks: a prompt's last block is partial, and the next turn's
    block at that place (the same bytes and more) has another key. That is the conversation growing."""
    common = CommonBlocks()
    head = chain("a", 3000, SYSTEM)
    turn1 = (*head, (101, 100))  # a partial last block
    common.observe(turn1)
    turn2 = (*head, (102, 256), (103, 256))  # the same place, filled, and more
    assert common.prefix_blocks(turn2) == 0


def test_a_second_conversation_on_a_fresh_router_is_not_pulled_to_the_first() -> None:
    router, backends = MinTTFT(), views(2)
    first = send(router, req("c0", chain("conv0", 30_000, SYSTEM)), backends, 0.0, finish=False)
    second = send(router, req("c1", chain("conv1", 30_000, SYSTEM)), backends, 0.1, finish=False)
    assert second.reason == "cold_hash" and second.backend != first.backend  # the first one's queue


def _agreement(load: bool) -> float:
    """Two routers with no shared state, each given a random half of 1,000 new conversations: how
    often would they place a new conversation on the same backend? With ``load``, requests stay in
    flight (about 5 per backend) and both see the backends' reported load, refreshed every 10
    requests as the pool's load poll would."""
    names = [f"b{i}" for i in range(8)]
    running = dict.fromkeys(names, 0)

    def snapshot() -> list[BackendView]:
        return [BackendView(name=n, kv_tokens=5_000_000, running=running[n]) for n in names]

    backends = snapshot()
    a, b = MinTTFT(seed=1), MinTTFT(seed=2)
    rng = random.Random(5)
    systems = (SYSTEM, chain("system2", 12_000))
    for r in (a, b):  # each replica has seen a few conversations of each assistant
        for i, system in enumerate(systems * 2):
            send(r, req(f"warm{i}", chain(f"warm{i}", 4000, system)), backends, 0.0)
    agree = 0
    open_: list[tuple[MinTTFT, str, str]] = []
    for i in range(1000):
        now = 1.0 + i
        if i % 10 == 0:
            backends = snapshot()
        fp = chain(f"conv{i}", rng.randint(5000, 60_000), systems[i % 2])
        r = req(f"c{i}", fp)
        mine, other = (a, b) if rng.random() < 0.5 else (b, a)
        d_other = other.route(r, backends, now)
        d = send(mine, r, backends, now, finish=not load)
        assert d_other is not None and d.reason == "cold_hash"
        agree += d.backend == d_other.backend
        if load:  # bounded load and the gate are in play
            running[d.backend] += 1
            open_.append((mine, r.rid, d.backend))
            if len(open_) > 40:
                router, rid, backend = open_.pop(rng.randrange(len(open_)))
                router.first_token(rid, now)
                router.finished(rid, backend, Outcome(), now)
                running[backend] -= 1
    return agree / 1000


@pytest.mark.parametrize("load", [False, True])
def test_two_replicas_agree_on_new_conversations(load: bool) -> None:
    assert _agreement(load) >= 0.95


def test_bounded_load_spreads_a_burst() -> None:
    router, backends = MinTTFT(), views(4)
    warm_up_common(router, backends)
    placed: Counter[str] = Counter()
    for i in range(40):  # 40 new conversations at once, none finishes
        d = send(router, req(f"c{i}", chain(f"burst{i}", 40_000, SYSTEM)), backends, 1.0, finish=False)
        placed[d.backend] += 1
    assert max(placed.values()) <= 1.25 * 40 / 4 + 1


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
    from loadtest.simulate import SimConfig, run_one

    cfg = dict(profile="b300-dp8-fp8", backends=1, conversations=8, minutes=4, warmup_minutes=1)
    pinned = run_one(SimConfig(policy="round-robin", routing="min-ttft", **cfg))
    direct = run_one(SimConfig(policy="direct", **cfg))
    assert pinned["cache_hit_rate"] > 0.9 > direct["cache_hit_rate"] + 0.2
