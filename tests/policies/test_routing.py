"""policies/routing.py: the ``Router`` contract (``route`` required, hooks with no-op defaults) and
plain round-robin, over backends or over every DP rank."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from policies.prefix_index import PrefixIndex
from policies.routing import ROUTER_HOOKS, RoundRobin, Router, RouterHook
from policies.types import BackendView, Dispatch, Outcome, RequestFacts

REQ = RequestFacts(rid="r", model="m")


class _First(Router):
    """The smallest router: ``route`` only."""

    name = "first"

    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        return Dispatch(req.rid, backends[0].name) if backends else None


def test_route_is_required() -> None:
    class _NoRoute(Router):
        name = "none"

    with pytest.raises(TypeError):
        _NoRoute()  # type: ignore[abstract]


def test_the_hooks_default_to_nothing() -> None:
    r = _First()
    d = r.route(REQ, [BackendView("b0")], 0.0)
    assert d == Dispatch("r", "b0")
    assert r.hooks == frozenset()
    assert r.dispatched(REQ, d, 0.0) is None
    assert r.first_token("r", 1.0) is None
    assert r.finished("r", "b0", Outcome(), 2.0) is None
    assert r.matched_tokens(REQ, "b0", None) is None  # no prefix index
    made: list[PrefixIndex] = []
    assert r.swap_index(lambda old: made.append(old) or PrefixIndex()) is None
    assert made == []  # nothing to swap: ``make`` is never called


def test_the_hook_names_are_the_literal_and_the_methods() -> None:
    assert set(ROUTER_HOOKS) == set(RouterHook.__args__)
    assert all(callable(getattr(Router, hook)) for hook in ROUTER_HOOKS)


def test_round_robin_names_and_no_backend() -> None:
    assert RoundRobin().name == "direct" and RoundRobin(over_ranks=True).name == "round-robin"
    assert RoundRobin().route(REQ, [], 0.0) is None
    assert RoundRobin(over_ranks=True).route(REQ, [], 0.0) is None


def test_direct_cycles_over_backends_and_leaves_the_rank_to_the_engine() -> None:
    rr = RoundRobin()
    backends = [BackendView("b0", dp_size=4), BackendView("b1"), BackendView("b2")]
    picks = [rr.route(RequestFacts(rid=f"r{i}", model="m"), backends, 0.0) for i in range(7)]
    assert [d.backend for d in picks if d] == ["b0", "b1", "b2", "b0", "b1", "b2", "b0"]
    assert all(d is not None and d.rank is None and d.reason == "least_wait" for d in picks)
    assert [d.rid for d in picks if d] == [f"r{i}" for i in range(7)]


def test_the_cycle_survives_a_changing_pool() -> None:
    rr = RoundRobin()
    three = [BackendView("b0"), BackendView("b1"), BackendView("b2")]
    assert [rr.route(REQ, three, 0.0).backend for _ in range(2)] == ["b0", "b1"]  # type: ignore[union-attr]
    two = [BackendView("b0"), BackendView("b2")]  # b1 left: the counter goes on modulo the new size
    assert [rr.route(REQ, two, 0.0).backend for _ in range(3)] == ["b0", "b2", "b0"]  # type: ignore[union-attr]


def test_over_ranks_each_rank_gets_its_share() -> None:
    rr = RoundRobin(over_ranks=True)
    backends = [BackendView("b0", dp_size=4), BackendView("b1", dp_size=4)]
    picks = Counter()
    for _ in range(80):
        d = rr.route(REQ, backends, 0.0)
        assert d is not None
        picks[(d.backend, d.rank)] += 1
    assert picks == Counter({(b, r): 10 for b in ("b0", "b1") for r in range(4)})


def test_over_ranks_without_dp_names_no_rank() -> None:
    rr = RoundRobin(over_ranks=True)
    backends = [BackendView("b0"), BackendView("b1", dp_size=0)]  # dp_size 0 counts as one rank
    picks = [rr.route(REQ, backends, 0.0) for _ in range(4)]
    assert [(d.backend, d.rank) for d in picks if d] == [("b0", None), ("b1", None)] * 2
