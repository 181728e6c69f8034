"""The wait bound (a team's ``max_wait_s``): admission plans for it. A waiter is overdue ``wait_lead_s``
before it and then goes first, takes an idle seat whatever the quantum, and half the lead before the bound
goes past the seat budget; where only the running cap keeps a waiter out it takes a free running slot after
``cap_patience_s`` and joins the engine's queue after ``cap_queue_s``; while the whole demand fits
``kv_overbook`` times the pool nobody waits for a seat; ``snapshot`` shows each team's oldest and expected
wait beside its bound."""

from __future__ import annotations

import itertools

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.teams import TeamLimits
from policies.types import BackendView, Dispatch, Outcome, RequestFacts

_ids = itertools.count()
DONE = Outcome(prompt_tokens=900, completion_tokens=100)
BOUND = SeatParams(quantum_s=900.0, min_hold_s=10.0, idle_release_s=1000.0, wait_lead_s=20.0)
"""Seats are kept while idle and a waiter takes one only at the quantum or when overdue (100 s here)."""
LIMITS = TeamLimits(max_concurrency=100, max_queue=100, queue_timeout_s=10_000.0, max_wait_s=120.0)


def turn(conv: str, team: str = "t", prompt: int = 900) -> RequestFacts:
    return RequestFacts(
        f"r{next(_ids)}", "m", team=team, prompt_tokens=prompt, max_output_tokens=100, conversation=conv
    )


def sent(decisions: list) -> list[Dispatch]:
    return [d for d in decisions if isinstance(d, Dispatch)]


def kv_full(params: SeatParams, busy: bool = False, idle: tuple[str, ...] = ("c0", "c1")) -> SeatedAdmission:
    """A 2400-token KV with two 1000-token seats (c0, c1), those in ``idle`` between turns unless ``busy``."""
    c = SeatedAdmission(RoundRobin(), default_team=LIMITS, params=params)
    c.set_backends("m", [BackendView("b0", kv_tokens=2400)], 0.0)
    rids = {}
    for conv in ("c0", "c1"):
        r = turn(conv)
        assert len(sent(c.arrive(r, 0.0))) == 1
        rids[conv] = r.rid
        if not busy and conv in idle:
            c.finish(r.rid, DONE, 1.0)
    return c


def test_an_overdue_waiter_takes_an_idle_seat_before_the_quantum() -> None:
    c = kv_full(BOUND)
    c2 = turn("c2")
    assert sent(c.arrive(c2, 2.0)) == []
    assert sent(c.tick(2.0 + 99.0)) == []  # 99 s < 120 - 20: not overdue yet, the quantum is 900 s
    placed = sent(c.tick(2.0 + 100.0))
    assert [d.rid for d in placed] == [c2.rid]
    assert "c2" in c.seats and "c0" not in c.seats  # the oldest idle seat gave way


def test_overdue_waiters_go_first_oldest_first_before_fair_order() -> None:
    c = kv_full(BOUND, idle=("c0",))  # one idle seat for two waiters
    old = turn("c2", team="heavy")
    assert sent(c.arrive(old, 2.0)) == []
    young = turn("c3", team="light")
    assert sent(c.arrive(young, 50.0)) == []
    c.team("heavy", 50.0).charge(1e9)  # served far more: fair order alone would seat "light" first
    placed = sent(c.tick(150.0))  # both overdue (148 s and 100 s of 100 s), one idle seat
    assert [d.rid for d in placed] == [old.rid]


def test_near_the_bound_with_no_idle_seat_a_waiter_goes_past_the_budget() -> None:
    c = kv_full(BOUND, busy=True)
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []
    assert sent(c.tick(109.0)) == []  # overdue, but every seat is busy: nothing can be made room for yet
    placed = sent(c.tick(110.0))  # half the lead before the bound: the engine's own behaviour
    assert [(d.rid, d.reason) for d in placed] == [(c2.rid, "overdue")]


def two_running(params: SeatParams, view: BackendView) -> tuple[SeatedAdmission, dict[str, str]]:
    """Seats c0 and c1 on ``view``, both running."""
    c = SeatedAdmission(RoundRobin(), default_team=LIMITS, params=params)
    c.set_backends("m", [view], 0.0)
    rids = {}
    for conv in ("c0", "c1"):
        r = turn(conv)
        assert len(sent(c.arrive(r, 0.0))) == 1  # both running, both seated
        rids[conv] = r.rid
    return c, rids


def full_cap() -> tuple[SeatedAdmission, dict[str, str]]:
    """One rank running at most 2, with 2 seats (c0, c1) both running; plenty of KV."""
    params = SeatParams(running_overbook=1.0, cap_patience_s=20.0, cap_queue_s=40.0)
    return two_running(params, BackendView("b0", kv_tokens=10**9, max_running_requests=2))


def test_where_only_the_running_cap_keeps_it_out_a_waiter_joins_the_engine_queue_after_cap_queue_s() -> None:
    c, _ = full_cap()
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []
    assert sent(c.tick(39.0)) == []  # past cap_patience_s, but no running slot is free
    lent = sent(c.tick(40.0))  # it queues in the engine: no free slot needed, no seat evicted
    assert [(d.rid, d.reason) for d in lent] == [(c2.rid, "lent")]
    assert {"c0", "c1"} <= set(c.seats)


def test_past_cap_patience_a_waiter_takes_a_free_running_slot() -> None:
    c, rids = full_cap()
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []
    assert sent(c.finish(rids["c0"], DONE, 10.0)) == []  # a free slot, but c2 has waited 10 s of 20
    lent = sent(c.tick(20.0))
    assert [(d.rid, d.reason) for d in lent] == [(c2.rid, "lent")]
    assert {"c0", "c1"} <= set(c.seats)  # c0 keeps its seat (and its cache) while it thinks


def test_snapshot_shows_each_teams_oldest_and_expected_wait_and_bound() -> None:
    c = kv_full(BOUND, busy=True)
    c.arrive(turn("c2"), 10.0)
    c.arrive(turn("c3"), 30.0)
    c.tick(70.0)
    team = c.snapshot()["teams"]["t"]  # type: ignore[index]
    assert team["oldest_wait_s"] == 60.0
    assert team["max_wait_s"] == 120.0
    assert 0.0 < team["expected_wait_s"] <= 120.0
    assert team["waiting"] == 2


def test_while_the_whole_demand_fits_kv_overbook_nobody_waits_for_a_seat() -> None:
    def two_seated() -> SeatedAdmission:  # 8000 of a 10000-token pool seated (0.85 of it: 8500)
        c = SeatedAdmission(RoundRobin(), default_team=LIMITS, params=SeatParams(idle_release_s=1000.0))
        c.set_backends("m", [BackendView("b0", kv_tokens=10_000)], 0.0)
        for conv in ("c0", "c1"):
            r = turn(conv, prompt=3900)
            assert len(sent(c.arrive(r, 0.0))) == 1
            c.finish(r.rid, Outcome(prompt_tokens=3900, completion_tokens=100), 1.0)
        return c

    c = two_seated()
    assert len(sent(c.arrive(turn("c2", prompt=1900), 2.0))) == 1  # 10000 in all <= 1.1 x 10000: at once
    c = two_seated()
    assert sent(c.arrive(turn("c2", prompt=3900), 2.0)) == []  # 12000 > 11000: the marks protect the pool


def learned_cap() -> tuple[SeatedAdmission, dict[str, str]]:
    """An endpoint that reports no KV, its running limit learned (2): seats c0 and c1, both running."""
    params = SeatParams(
        running_overbook=1.0, cap_patience_s=20.0, cap_queue_s=40.0, min_hold_s=10.0, wait_lead_s=20.0,
        idle_release_s=1000.0, full_idle_release_s=1000.0,
    )  # fmt: skip
    return two_running(params, BackendView("b0", max_running_requests=2))


def test_a_learned_limit_is_not_borrowed_past_it_guards_the_cache_as_the_kv_does() -> None:
    c, rids = learned_cap()
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []
    assert sent(c.finish(rids["c0"], DONE, 10.0)) == []
    assert sent(c.tick(45.0)) == []  # past cap_patience_s and cap_queue_s: no running slot lent
    placed = sent(c.tick(100.0))  # overdue (120 - 20): it takes the idle seat
    assert [d.rid for d in placed] == [c2.rid]
    assert "c2" in c.seats and "c0" not in c.seats and "c1" in c.seats
