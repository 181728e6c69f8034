"""The product router ``min-ttft`` (policies/routers/min_ttft.py): where it places a conversation
(the holder, a queue, the imbalance gate, ties, common prefixes, agreement across replicas)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from policies.routers import CommonBlocks, MinTTFT
from policies.types import BackendView, Dispatch, Outcome
from tests.policies.routing_helpers import SYSTEM, chain, req, send, views, warm_up_common


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
