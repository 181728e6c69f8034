"""policies/routers/min_ttft.py: ``MinTTFT``'s own bookkeeping, one piece at a time: the decision's
scores, the prefix index (its hooks, capacity, swap), the prefill queue it counts per rank, the wait
for a running slot, the speed it learns and when it does not, and cold keys without a fingerprint.
The routing behaviour under load is ``tests/policies/test_routing_*.py``."""

from __future__ import annotations

import pytest

from policies.prefix_index import PrefixIndex
from policies.routers import MinTTFT
from policies.types import BackendView, Dispatch, Outcome, RequestFacts
from tests.policies.routing_helpers import chain, req, views


def _route(router: MinTTFT, r: RequestFacts, backends: list[BackendView], now: float) -> Dispatch:
    d = router.route(r, backends, now)
    assert d is not None
    return d


def _dispatch(router: MinTTFT, r: RequestFacts, backends: list[BackendView], now: float) -> Dispatch:
    d = _route(router, r, backends, now)
    router.dispatched(r, d, now)
    return d


def test_no_backend_no_decision() -> None:
    assert MinTTFT().route(req("r", chain("x", 1000)), [], 0.0) is None


def test_a_cold_request_is_hashed_and_its_scores_say_what_was_weighed() -> None:
    d = _route(MinTTFT(), req("r", chain("x", 8000)), views(3), 0.0)
    assert d.reason == "cold_hash" and d.matched_tokens == 0
    assert d.scores["prompt_tokens"] == 8000 and d.scores["candidates"] == 3
    assert d.scores["common_tokens"] == 0 and d.scores["best_match_tokens"] == 0
    assert d.scores["expected_ttft_s"] == pytest.approx(MinTTFT().model.seconds(8000, 0))
    assert {k for k in d.scores if k.startswith("ttft_s:")} == {"ttft_s:b0@0", "ttft_s:b1@0", "ttft_s:b2@0"}


def test_at_most_eight_candidates_are_listed_in_the_scores() -> None:
    d = _route(MinTTFT(), req("r", chain("x", 1000)), views(3, dp=4), 0.0)
    assert d.scores["candidates"] == 12 and sum(k.startswith("ttft_s:") for k in d.scores) == 8


def test_the_index_holds_what_was_dispatched_where_it_went() -> None:
    router, backends = MinTTFT(), views(2)
    fp = chain("conv", 5000)
    d = _dispatch(router, req("r", fp), backends, 0.0)
    other = "b1" if d.backend == "b0" else "b0"
    assert router.matched_tokens(req("r2", fp), d.backend, None) == 5000
    assert router.matched_tokens(req("r2", fp), other, None) == 0
    nxt = chain("more", 1000, fp)
    assert router.matched_tokens(req("r3", nxt), d.backend, None) == 5000
    again = _route(router, req("r3", nxt), backends, 1.0)
    assert (again.backend, again.reason, again.matched_tokens) == (d.backend, "prefix", 5000)


def test_each_ranks_index_is_bounded_by_its_reported_kv() -> None:
    router = MinTTFT(default_capacity=10**6)
    small = [BackendView("b0", kv_tokens=3000)]
    fp = chain("conv", 8192)  # eight blocks of 1,024 and more
    _dispatch(router, req("r", fp), small, 0.0)
    assert router.index.slot(("b0", None)).capacity == 3000
    assert router.matched_tokens(req("r2", fp), "b0", None) <= 3000


def test_swap_index_hands_over_the_old_index_and_routes_on_the_new_one() -> None:
    router, backends = MinTTFT(), views(1)
    fp = chain("conv", 4000)
    _dispatch(router, req("r", fp), backends, 0.0)
    seen: list[PrefixIndex] = []

    def make(old: PrefixIndex) -> PrefixIndex:
        seen.append(old)
        return PrefixIndex()

    old = router.index
    new = router.swap_index(make)
    assert seen == [old] and router.index is new is not old
    assert router.matched_tokens(req("r2", fp), "b0", None) == 0


def test_the_prefill_queue_is_counted_until_the_first_token() -> None:
    router, one = MinTTFT(), views(1)
    big = req("big", chain("big", 100_000))
    _dispatch(router, big, one, 0.0)
    predicted = router.model.seconds(100_000, 0)
    probe = _route(router, req("p", chain("p", 1000)), one, 1.0)
    assert probe.scores["wait_s"] == pytest.approx(predicted - 1.0)  # its prefill still ahead of a newcomer
    router.first_token("big", 2.0)
    probe = _route(router, req("p", chain("p", 1000)), one, 2.0)
    assert probe.scores["wait_s"] == 0.0
    router.first_token("big", 3.0)  # a second first token changes nothing
    router.first_token("ghost", 3.0)


def test_a_full_running_cap_adds_the_wait_for_a_slot() -> None:
    router = MinTTFT()
    capped = [BackendView("b0", kv_tokens=10**6, max_running_requests=2)]
    for i in range(2):
        r = req(f"r{i}", chain(f"r{i}", 1000))
        _dispatch(router, r, capped, 0.0)
        router.first_token(r.rid, 0.1)
    probe = _route(router, req("p", chain("p", 1000)), capped, 0.2)
    assert probe.scores["wait_s"] == pytest.approx((2 + 1 - 2) * 10.0 / 2)  # one mean decode (10 s prior) / C


def _serve(router: MinTTFT, rid: str, tokens: int, at: float, ttft: float, outcome: Outcome | None = None) -> None:
    r = req(rid, chain(rid, tokens))
    _dispatch(router, r, views(1), at)
    router.first_token(rid, at + ttft)
    router.finished(rid, "b0", outcome or Outcome(prompt_tokens=tokens), at + ttft + 1.0)


def test_the_learned_speed_is_clipped() -> None:
    router = MinTTFT(learn_alpha=1.0)
    _serve(router, "fast", 40_000, 0.0, ttft=1e-4)
    assert router.speed["b0"] == 10.0
    _serve(router, "slow", 40_000, 100.0, ttft=1e4)
    assert router.speed["b0"] == 0.1


def test_nothing_is_learned_from_short_queued_or_failed_requests() -> None:
    router = MinTTFT(learn_alpha=1.0)
    _serve(router, "tiny", 100, 0.0, ttft=5.0)  # predicted below min_learn_s: too noisy
    _serve(router, "failed", 40_000, 100.0, ttft=5.0, outcome=Outcome(ok=False))
    assert router.speed == {}
    r1, r2 = req("q1", chain("q1", 40_000)), req("q2", chain("q2", 40_000))
    _dispatch(router, r1, views(1), 200.0)
    _dispatch(router, r2, views(1), 200.0)  # queued behind q1: its TTFT is not its own prefill
    router.first_token("q2", 210.0)
    router.finished("q2", "b0", Outcome(prompt_tokens=40_000), 211.0)
    assert router.speed == {}


def test_a_request_without_a_fingerprint_is_placed_by_its_conversation_in_every_replica() -> None:
    backends = views(8)

    def place(router: MinTTFT, rid: str, conversation: str | None) -> str:
        r = RequestFacts(rid=rid, model="m", prompt_tokens=500, conversation=conversation)
        return _route(router, r, backends, 0.0).backend

    a, b = MinTTFT(), MinTTFT(seed=99)
    assert {place(a, "x1", "conv-7"), place(a, "x2", "conv-7"), place(b, "x3", "conv-7")} == {place(a, "x", "conv-7")}
    spread = {place(a, f"solo{i}", None) for i in range(40)}  # keyed by request id: spread over the pool
    assert len(spread) >= 5


def test_a_request_dispatched_again_counts_where_it_went_last() -> None:
    router = MinTTFT()
    r = req("r", chain("r", 2000))
    router.dispatched(r, Dispatch("r", "b0"), 0.0)
    router.dispatched(r, Dispatch("r", "b1"), 0.0)
    assert router._slots[("b0", None)].inflight == 0 and router._slots[("b1", None)].inflight == 1
    router.finished("r", "b1", Outcome(), 1.0)
    assert router._slots[("b1", None)].inflight == 0
    router.finished("r", "b1", Outcome(), 1.0)  # twice: ignored
    assert router._slots[("b1", None)].inflight == 0


def test_a_request_dispatched_again_leaves_nothing_queued_where_it_went_first() -> None:
    router = MinTTFT()
    r = req("r", chain("r", 100_000))
    router.dispatched(r, Dispatch("r", "b0"), 0.0)
    router.dispatched(r, Dispatch("r", "b1"), 0.0)
    router.first_token("r", 1.0)
    router.finished("r", "b1", Outcome(), 2.0)
    x = req("x", chain("x", 1000))
    router.dispatched(x, Dispatch("x", "b0"), 100.0)
    router.first_token("x", 100.5)  # b0 has nothing left to prefill
    probe = _route(router, req("p", chain("p", 1000)), views(1), 100.5)
    assert probe.scores["wait_s"] == 0.0
