"""policies/routers/least_load.py: fewest in-flight requests per (backend, rank), counted from this
router's own dispatches, ties broken by a seeded RNG."""

from __future__ import annotations

from policies.routers import LeastLoad
from policies.types import BackendView, Dispatch, Outcome, RequestFacts

THREE = [BackendView("b0"), BackendView("b1"), BackendView("b2")]


def _req(rid: str) -> RequestFacts:
    return RequestFacts(rid=rid, model="m")


def _send(router: LeastLoad, rid: str, backends: list[BackendView]) -> Dispatch:
    d = router.route(_req(rid), backends, 0.0)
    assert d is not None
    router.dispatched(_req(rid), d, 0.0)
    return d


def test_no_backend_no_decision() -> None:
    assert LeastLoad().route(_req("r"), [], 0.0) is None


def test_the_least_loaded_slot_wins_with_its_count_as_the_score() -> None:
    router = LeastLoad()
    for rid, backend in (("x", "b0"), ("y", "b0"), ("z", "b2")):
        router.dispatched(_req(rid), Dispatch(rid, backend), 0.0)
    d = router.route(_req("r"), THREE, 0.0)
    assert d is not None and (d.backend, d.rank, d.reason) == ("b1", None, "least_wait")
    assert d.scores == {"inflight": 0.0}


def test_routing_alone_counts_nothing() -> None:
    router = LeastLoad(seed=3)
    picks = {router.route(_req(f"r{i}"), THREE, 0.0).backend for i in range(40)}  # type: ignore[union-attr]
    assert picks == {"b0", "b1", "b2"}  # never dispatched: every backend stays at zero, ties at random


def test_the_tie_break_is_seeded() -> None:
    def sequence(seed: int) -> list[str]:
        router = LeastLoad(seed=seed)
        return [router.route(_req(f"r{i}"), THREE, 0.0).backend for i in range(30)]  # type: ignore[union-attr]

    assert sequence(1) == sequence(1)
    assert sequence(1) != sequence(2)


def test_a_finished_request_frees_its_slot_and_unknown_ones_change_nothing() -> None:
    router = LeastLoad()
    two = THREE[:2]
    first = _send(router, "a", two)
    second = _send(router, "b", two)
    assert first.backend != second.backend
    router.finished("ghost", "b0", Outcome(), 1.0)
    router.finished("a", first.backend, Outcome(ok=False), 1.0)  # failed or not: it no longer runs
    assert _send(router, "c", two).backend == first.backend


def test_a_request_dispatched_again_counts_only_where_it_went_last() -> None:
    router = LeastLoad()
    router.dispatched(_req("a"), Dispatch("a", "b0"), 0.0)
    router.dispatched(_req("a"), Dispatch("a", "b1"), 0.0)
    router.dispatched(_req("b"), Dispatch("b", "b2"), 0.0)
    d = router.route(_req("r"), THREE, 0.0)
    assert d is not None and d.backend == "b0"


def test_ranks_are_counted_apart() -> None:
    router = LeastLoad()
    dp = [BackendView("node", dp_size=2), BackendView("solo")]
    picks = sorted((d.backend, d.rank) for d in (_send(router, f"r{i}", dp) for i in range(6)))  # type: ignore[type-var]
    assert picks == [("node", 0), ("node", 0), ("node", 1), ("node", 1), ("solo", None), ("solo", None)]
