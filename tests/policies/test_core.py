"""policies/core.py: the ``DecisionCore`` contract's defaults, and ``PassThroughCore`` (no admission:
route on arrival, refuse what can never run, retry elsewhere)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import get_args

import pytest

from policies.core import HOOKS, DecisionCore, Hook, PassThroughCore
from policies.routers import LeastLoad
from policies.routing import RoundRobin
from policies.teams import TeamLimits
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts


class _Recording(RoundRobin):
    """Round-robin that notes the hooks the core sends it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, object]] = []

    def dispatched(self, req: RequestFacts, decision: Dispatch, now: float) -> None:
        self.calls.append(("dispatched", req.rid, decision.backend))

    def first_token(self, rid: str, now: float) -> None:
        self.calls.append(("first_token", rid, now))

    def finished(self, rid: str, backend: str, outcome: Outcome, now: float) -> None:
        self.calls.append(("finished", rid, (backend, outcome.reached_backend)))


def _req(rid: str, tokens: int = 100, out: int = 0, team: str = "t", model: str = "m") -> RequestFacts:
    return RequestFacts(rid=rid, model=model, team=team, prompt_tokens=tokens, max_output_tokens=out)


def _core(*backends: BackendView, router: RoundRobin | LeastLoad | None = None) -> PassThroughCore:
    core = PassThroughCore(router or _Recording())
    core.set_backends("m", list(backends) or [BackendView("b0"), BackendView("b1")], 0.0)
    return core


def _one(decisions: list[Decision]) -> Decision:
    assert len(decisions) == 1
    return decisions[0]


# -- the contract ----------------------------------------------------------------------------------


def test_the_hook_names_are_the_literal() -> None:
    assert get_args(Hook) == HOOKS


def test_a_core_must_handle_every_event() -> None:
    class _Partial(DecisionCore):
        def tick(self, now: float) -> list[Decision]:
            return []

    with pytest.raises(TypeError, match="abstract"):
        _Partial()  # type: ignore[abstract]


def test_the_optional_hooks_default_to_nothing() -> None:
    class _Minimal(DecisionCore):
        name = "minimal"

        def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
            return []

        def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
            return []

        def first_token(self, rid: str, now: float) -> list[Decision]:
            return []

        def finish(self, rid: str, outcome: Outcome, now: float) -> list[Decision]:
            return []

        def cancel(self, rid: str, now: float) -> list[Decision]:
            return []

        def retry(self, rid: str, failed_backend: str, now: float) -> list[Decision]:
            return []

        def tick(self, now: float) -> list[Decision]:
            return []

    core = _Minimal()
    assert core.hooks == frozenset()
    core.configure({"teams": {"t": {"max_concurrency": 1}}})
    core.set_team("t", TeamLimits(max_concurrency=1))
    assert core.limits == {} and core.teams == {}  # both ignored by default
    assert core.set_share(0.5, True, 0.0) == [] and core.wake("t", 0.0) == [] and core.requeue("r", 0.0) == []
    assert core.team("t", 0.0) is None and core.snapshot() == {}
    with pytest.raises(TypeError):
        core.limits["t"] = TeamLimits()  # type: ignore[index]  # the default mappings are read-only


# -- PassThroughCore -------------------------------------------------------------------------------


def test_it_is_named_after_its_router_unless_labelled() -> None:
    assert PassThroughCore(LeastLoad()).name == "least-load"
    assert PassThroughCore(LeastLoad(), "my-stack").name == "my-stack"
    assert PassThroughCore(LeastLoad()).hooks == frozenset({"configure", "set_team"})


def test_a_request_is_routed_on_arrival_and_the_router_told() -> None:
    core = _core()
    router = core.router
    assert isinstance(router, _Recording)
    picks = [_one(core.arrive(_req(f"r{i}"), 0.0)) for i in range(3)]
    assert [(type(d), d.backend) for d in picks if isinstance(d, Dispatch)] == [
        (Dispatch, "b0"),
        (Dispatch, "b1"),
        (Dispatch, "b0"),
    ]
    assert router.calls == [("dispatched", "r0", "b0"), ("dispatched", "r1", "b1"), ("dispatched", "r2", "b0")]
    assert core.inflight() == {"b0": 2, "b1": 1}
    assert core.tick(100.0) == []  # nothing waits here


def test_no_healthy_backend_is_a_503_with_a_retry_after() -> None:
    core = _core(BackendView("b0", healthy=False))
    refused = _one(core.arrive(_req("r"), 0.0))
    assert isinstance(refused, Refuse)
    assert (refused.code, refused.status, refused.retry_after_s) == ("no_healthy_backend", 503, 5.0)
    other = _one(core.arrive(_req("x", model="unknown"), 0.0))
    assert isinstance(other, Refuse) and "'unknown'" in other.message
    assert core.inflight() == {}


def test_unhealthy_and_excluded_backends_are_skipped() -> None:
    core = _core(BackendView("b0", healthy=False), BackendView("b1"), BackendView("b2"))
    excluded = RequestFacts(rid="r", model="m", exclude=frozenset({"b1"}))
    assert [_one(core.arrive(excluded, 0.0)).backend for _ in range(2)] == ["b2", "b2"]  # type: ignore[union-attr]


def test_a_request_no_backend_can_ever_run_is_refused_at_once() -> None:
    core = _core(BackendView("b0", kv_tokens=1000), BackendView("b1", kv_tokens=1000, context_tokens=4000))
    refused = _one(core.arrive(_req("big", tokens=5000), 0.0))
    assert isinstance(refused, Refuse) and (refused.code, refused.status) == ("context_length_exceeded", 400)
    assert core.router.calls == []  # type: ignore[attr-defined]  # never routed


def test_only_backends_that_can_hold_it_are_candidates() -> None:
    core = _core(BackendView("small", kv_tokens=1000), BackendView("large", kv_tokens=100_000))
    picks = {_one(core.arrive(_req(f"r{i}", tokens=5000), 0.0)).backend for i in range(4)}  # type: ignore[union-attr]
    assert picks == {"large"}
    assert {_one(core.arrive(_req(f"s{i}", tokens=500), 0.0)).backend for i in range(4)} == {"small", "large"}  # type: ignore[union-attr]


def test_configure_takes_the_default_and_listed_teams_request_ceilings() -> None:
    core = _core()
    core.configure({"teams": {"default": {"max_request_tokens": 1000}, "big": {"max_request_tokens": 10_000}}})
    refused = _one(core.arrive(_req("r", tokens=900, out=200, team="anyone"), 0.0))
    assert isinstance(refused, Refuse) and (refused.code, refused.status) == ("team_request_tokens", 400)
    assert isinstance(_one(core.arrive(_req("s", tokens=900, out=200, team="big"), 0.0)), Dispatch)
    core.set_team("big", TeamLimits(max_request_tokens=500))
    assert isinstance(_one(core.arrive(_req("u", tokens=900, out=200, team="big"), 0.0)), Refuse)
    assert core.team("big", 0.0) is None  # no team leases under this core


def test_first_token_and_finish_reach_the_router_only_for_requests_in_flight() -> None:
    core = _core()
    core.arrive(_req("r"), 0.0)
    core.first_token("r", 0.5)
    core.first_token("ghost", 0.5)
    assert core.finish("r", Outcome(), 1.0) == []
    assert core.finish("r", Outcome(), 1.0) == []  # twice: the second is ignored
    core.finish("ghost", Outcome(), 1.0)
    assert core.router.calls[1:] == [("first_token", "r", 0.5), ("finished", "r", ("b0", True))]  # type: ignore[attr-defined]
    assert core.inflight() == {}


def test_cancel_forgets_a_request_without_telling_the_router() -> None:
    core = _core()
    core.arrive(_req("r"), 0.0)
    assert core.cancel("r", 0.1) == [] and core.inflight() == {}
    assert [c[0] for c in core.router.calls] == ["dispatched"]  # type: ignore[attr-defined]


def test_retry_goes_elsewhere_with_reason_retry() -> None:
    core = _core(BackendView("b0"), BackendView("b1"), BackendView("b2"))
    first = _one(core.arrive(_req("r"), 0.0))
    assert isinstance(first, Dispatch) and first.backend == "b0"
    again = _one(core.retry("r", "b0", 0.1))
    assert isinstance(again, Dispatch) and again.backend != "b0" and again.reason == "retry"
    assert ("finished", "r", ("b0", False)) in core.router.calls  # type: ignore[attr-defined]  # never reached b0
    third = _one(core.retry("r", again.backend, 0.2))
    assert isinstance(third, Dispatch) and third.backend not in {"b0", again.backend}  # both stay excluded
    assert core.inflight() == {third.backend: 1}


def test_retry_with_nowhere_left_is_a_503_and_unknown_retries_nothing() -> None:
    core = _core(BackendView("b0"))
    core.arrive(_req("r"), 0.0)
    refused = _one(core.retry("r", "b0", 0.1))
    assert isinstance(refused, Refuse) and refused.code == "no_healthy_backend" and refused.status == 503
    assert core.retry("ghost", "b0", 0.1) == []
    assert core.inflight() == {}


def test_set_backends_replaces_the_models_view() -> None:
    core = _core(BackendView("b0"))
    core.set_backends("m", [BackendView("b9")], 1.0)
    assert _one(core.arrive(_req("r"), 1.0)).backend == "b9"  # type: ignore[union-attr]
    core.set_backends("m", [], 2.0)
    assert isinstance(_one(core.arrive(_req("s"), 2.0)), Refuse)
