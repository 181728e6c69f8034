"""policies/admission/core.py: ``SeatedAdmission``'s events and hooks, one at a time, with time passed
in (the behaviour suites ``tests/policies/test_admission*.py`` drive it under load)."""

from __future__ import annotations

import itertools

import pytest

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.teams import TeamLimits
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts

_ids = itertools.count()


class _Recording(RoundRobin):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def first_token(self, rid: str, now: float) -> None:
        self.calls.append(("first_token", rid))

    def finished(self, rid: str, backend: str, outcome: Outcome, now: float) -> None:
        self.calls.append(("finished", rid))


def _core(backends: int = 1, kv: int = 10_000, **params: float | str) -> SeatedAdmission:
    base = {"admit_water": 1.0, "high_water": 1.0, "kv_overbook": 1.0}
    c = SeatedAdmission(_Recording(), params=SeatParams(**{**base, **params}))  # type: ignore[arg-type]
    c.set_backends("m", [BackendView(f"b{i}", kv_tokens=kv) for i in range(backends)], 0.0)
    return c


def _req(tokens: int = 900, team: str = "t", conv: str | None = None) -> RequestFacts:
    return RequestFacts(
        rid=f"r{next(_ids)}", model="m", team=team, prompt_tokens=tokens, max_output_tokens=100, conversation=conv
    )


def _went(decisions: list[Decision]) -> list[Dispatch]:
    return [d for d in decisions if isinstance(d, Dispatch)]


def _refused(decisions: list[Decision]) -> list[Refuse]:
    return [d for d in decisions if isinstance(d, Refuse)]


def test_it_implements_every_hook() -> None:
    c = _core()
    assert c.hooks == {"configure", "set_team", "set_share", "wake", "requeue", "team", "snapshot"}
    assert c.name == "gateway" and SeatedAdmission(RoundRobin(), name="x").name == "x"


def test_configure_takes_teams_the_default_and_seat_parameters() -> None:
    c = _core()
    c.configure({"teams": {"a": {"max_concurrency": 1}, "default": {"max_queue": 2}}, "admission": {"quantum_s": 60}})
    assert c.limits["a"] == TeamLimits(max_concurrency=1) and c.default_team == TeamLimits(max_queue=2)
    assert c.params == SeatParams(quantum_s=60)  # a section replaces every parameter it does not set
    assert c.team("unlisted", 0.0).limits == TeamLimits(max_queue=2)
    c.configure({"teams": {}})
    assert c.params == SeatParams(quantum_s=60)  # no admission section: parameters kept


def test_set_team_changes_a_running_teams_limits_and_keeps_its_counters() -> None:
    c = _core()
    c.arrive(_req(), 0.0)
    team = c.team("t", 0.0)
    assert team.inflight == 1
    c.set_team("t", TeamLimits(max_concurrency=1))
    assert c.team("t", 1.0) is team and team.limits.max_concurrency == 1 and team.inflight == 1
    assert c.arrive(_req(), 1.0) == []  # at its new cap: it waits


def test_the_share_is_clamped_and_scales_the_budget() -> None:
    c = _core()
    c.set_share(5.0, False, 0.0)
    assert c.share == 1.0
    c.set_share(0.0, True, 0.0)
    assert c.share == 1e-6 and c.split_concurrency
    c.set_share(0.5, False, 0.0)
    assert _went(c.arrive(_req(4000), 0.0))  # 4,100 ≤ half of 10,000
    assert c.arrive(_req(1000), 0.0) == []  # 4,100 + 1,100 > 5,000
    assert c.reserved[("b0", None)] == 4100
    assert len(_went(c.set_share(1.0, False, 1.0))) == 1  # the whole pool again: it goes


def test_requeue_blocks_the_team_until_a_wake_or_a_second() -> None:
    c = _core()
    [d] = _went(c.arrive(_req(), 0.0))
    assert c.requeue(d.rid, 0.1) == []
    assert d.rid in c.waiting and c.team("t", 0.1).blocked_until == pytest.approx(1.1)
    assert c.tick(0.5) == []  # still held off
    assert [x.rid for x in _went(c.wake("t", 0.6))] == [d.rid]
    assert c.requeue("ghost", 1.0) == [] and c.wake("nobody", 1.0) == []


def test_a_blocked_team_goes_again_after_a_second_without_a_wake() -> None:
    c = _core()
    [d] = _went(c.arrive(_req(), 0.0))
    c.requeue(d.rid, 0.0)
    assert [x.rid for x in _went(c.tick(1.0))] == [d.rid]


def test_finish_charges_the_actual_tokens_and_resizes_the_seat() -> None:
    c = _core()
    r = _req(900, conv="c")
    c.arrive(r, 0.0)
    assert c.team("t", 0.0).vtc == 1000  # charged the need at dispatch
    assert c.finish(r.rid, Outcome(prompt_tokens=1200, completion_tokens=300), 1.0) == []
    assert c.team("t", 1.0).vtc == 1500 and c.team("t", 1.0).inflight == 0
    seat = c.seats["c"]
    assert (seat.tokens, seat.busy, seat.last_active) == (1500, 0, 1.0) and c.reserved[("b0", None)] == 1500
    assert c.router.calls == [("finished", r.rid)]  # type: ignore[attr-defined]
    assert c.finish(r.rid, Outcome(), 2.0) == []  # twice: ignored


@pytest.mark.parametrize("outcome", [Outcome(refused=True), Outcome(ok=False, reached_backend=False)])
def test_a_turn_that_left_nothing_on_the_engine_gives_its_seat_back(outcome: Outcome) -> None:
    c = _core()
    r = _req(conv="c")
    c.arrive(r, 0.0)
    c.finish(r.rid, outcome, 1.0)
    assert c.seats == {} and c.reserved[("b0", None)] == 0


def test_first_token_reaches_the_router_only_for_a_running_request() -> None:
    c = _core()
    r = _req()
    c.arrive(r, 0.0)
    assert c.first_token(r.rid, 0.5) == [] and c.first_token("ghost", 0.5) == []
    assert c.router.calls == [("first_token", r.rid)]  # type: ignore[attr-defined]


def test_cancel_takes_a_waiter_out_and_hands_its_place_on() -> None:
    c = _core(kv=2000)
    first, second, third = _req(1500, conv="a"), _req(1500, conv="b"), _req(100, conv="c")
    c.arrive(first, 0.0)
    assert c.arrive(second, 0.0) == []
    assert c.arrive(third, 0.0) == []  # the blocked head keeps the only slot: nothing passes it
    assert c.team("t", 0.0).waiting == 2
    assert [d.rid for d in _went(c.cancel(second.rid, 1.0))] == [third.rid]
    assert c.team("t", 1.0).waiting == 0 and c.cancel("ghost", 1.0) == []


def test_retry_releases_the_seat_on_the_failed_backend_and_goes_elsewhere() -> None:
    c = _core(backends=2)
    [d] = _went(c.arrive(_req(conv="c"), 0.0))
    [again] = _went(c.retry(d.rid, d.backend, 0.1))
    assert again.backend != d.backend and again.reason == "retry"
    assert c.seats["c"].slot == (again.backend, None) and c.reserved[(d.backend, None)] == 0
    assert c.team("t", 0.1).inflight == 1 and c.team("t", 0.1).vtc == 1000  # the first charge taken back
    assert c.retry("ghost", "b0", 0.2) == []


def test_retry_with_nowhere_else_is_a_503() -> None:
    c = _core(backends=1)
    [d] = _went(c.arrive(_req(), 0.0))
    [refused] = _refused(c.retry(d.rid, "b0", 0.1))
    assert (refused.code, refused.status) == ("no_healthy_backend", 503)
    assert c.running == {} and c.team("t", 0.1).inflight == 0


def test_no_healthy_backend_left_after_exclusions_is_a_503() -> None:
    c = _core(backends=2)
    r = RequestFacts(rid="x", model="m", exclude=frozenset({"b0", "b1"}))
    [refused] = _refused(c.arrive(r, 0.0))
    assert refused.code == "no_healthy_backend" and refused.retry_after_s == 5.0
    [other] = _refused(c.arrive(RequestFacts(rid="y", model="unknown"), 0.0))
    assert other.status == 503


def test_tick_refuses_waiters_past_their_queue_timeout() -> None:
    c = _core(kv=2000)
    c.set_team("t", TeamLimits(queue_timeout_s=10.0))
    c.arrive(_req(1800, conv="a"), 0.0)
    late = _req(1800, conv="b")
    c.arrive(late, 0.0)
    assert _refused(c.tick(10.0)) == []  # exactly the timeout: still waits
    [refused] = _refused(c.tick(10.5))
    assert refused.rid == late.rid and refused.code == "queue_timeout" and "limit 10 s" in refused.message
    assert c.waiting == {} and c.team("t", 10.5).waiting == 0


def test_tick_releases_idle_seats_after_idle_release() -> None:
    c = _core(idle_release_s=30.0)
    r = _req(conv="c")
    c.arrive(r, 0.0)
    c.finish(r.rid, Outcome(), 5.0)
    c.tick(35.0)
    assert "c" in c.seats  # idle exactly 30 s
    c.tick(35.5)
    assert c.seats == {} and c.reserved[("b0", None)] == 0


def test_a_backend_that_goes_unhealthy_or_leaves_takes_its_seats_with_it() -> None:
    c = _core(backends=2)
    for conv in ("a", "b"):
        c.arrive(_req(conv=conv), 0.0)
    on_b0 = [k for k, s in c.seats.items() if s.slot == ("b0", None)]
    c.set_backends("m", [BackendView("b0", kv_tokens=10_000, healthy=False), BackendView("b1", kv_tokens=10_000)], 1.0)
    assert on_b0 and not set(on_b0) & set(c.seats)
    c.set_backends("m", [BackendView("b0", kv_tokens=10_000)], 2.0)
    assert c.seats == {}


def test_snapshot_is_taken_at_the_latest_event() -> None:
    c = _core(kv=2000)
    c.arrive(_req(1800, conv="a"), 0.0)
    c.arrive(_req(1800, conv="b"), 3.0)
    c.tick(7.0)
    snap = c.snapshot()
    assert snap["waiting"] == 1 and snap["running"] == 1
    assert snap["teams"]["t"]["oldest_wait_s"] == 4.0  # type: ignore[index]
    assert snap["backends"] == {"b0": {"reserved_tokens": 1900, "seats": 1}}
