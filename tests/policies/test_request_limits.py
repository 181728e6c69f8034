"""Requests that can never run are refused on arrival; a refused request gives its seat back at once;
a blocked head keeps only its own slot (backfill elsewhere). The decision core, time passed in."""

from __future__ import annotations

import itertools

from policies.admission import SeatedAdmission, SeatParams
from policies.core import PassThroughCore
from policies.routing import RoundRobin
from policies.teams import TeamLimits
from policies.types import BackendView, Dispatch, Outcome, Refuse, RequestFacts

_ids = itertools.count()


def core(views: list[BackendView], teams: dict[str, TeamLimits] | None = None, **params: float) -> SeatedAdmission:
    c = SeatedAdmission(RoundRobin(), teams=teams or {}, params=SeatParams(**params))  # type: ignore[arg-type]
    c.set_backends("m", views, 0.0)
    return c


def req(team: str = "t", tokens: int = 900, out: int = 100, conv: str | None = None) -> RequestFacts:
    return RequestFacts(
        rid=f"r{next(_ids)}", model="m", team=team, prompt_tokens=tokens, max_output_tokens=out, conversation=conv
    )


def test_prompt_past_the_kv_cache_is_refused_at_once() -> None:
    c = core([BackendView("b0", kv_tokens=65_536), BackendView("b1", kv_tokens=65_536)], high_water=0.95)
    [refusal] = c.arrive(req(tokens=138_000, out=0), 0.0)
    assert isinstance(refusal, Refuse) and refusal.code == "context_length_exceeded" and refusal.status == 400
    assert "KV cache" in refusal.message and not c.waiting and not c.reserved
    # just under the high-water mark: it may run (alone), so it waits or goes
    assert isinstance(c.arrive(req(tokens=62_000, out=0), 0.0)[0], Dispatch)


def test_context_window_bounds_prompt_and_output() -> None:
    c = core([BackendView("b0", kv_tokens=10**9, context_tokens=32_768)])
    [r1] = c.arrive(req(tokens=32_768, out=0), 0.0)
    [r2] = c.arrive(req(tokens=30_000, out=4_000), 0.0)
    assert isinstance(r1, Refuse) and r1.code == "context_length_exceeded" and "context window" in r1.message
    assert isinstance(r2, Refuse) and r2.code == "context_length_exceeded" and "max_tokens 4000" in r2.message
    assert isinstance(c.arrive(req(tokens=30_000, out=2_000), 0.0)[0], Dispatch)


def test_one_backend_that_can_hold_it_is_enough_and_unknown_never_refuses() -> None:
    c = core([BackendView("small", kv_tokens=10_000), BackendView("big", kv_tokens=100_000)])
    [d] = c.arrive(req(tokens=50_000), 0.0)
    assert isinstance(d, Dispatch) and d.backend == "big"
    unknown = core([BackendView("b0")])  # capacity and window unknown: the engine judges
    assert isinstance(unknown.arrive(req(tokens=10**7), 0.0)[0], Dispatch)


def test_team_request_ceiling() -> None:
    c = core([BackendView("b0", kv_tokens=10**6)], teams={"small": TeamLimits(max_request_tokens=8_000)})
    [r] = c.arrive(req("small", tokens=7_000, out=2_000), 0.0)
    assert isinstance(r, Refuse) and r.code == "team_request_tokens" and r.status == 400
    assert isinstance(c.arrive(req("small", tokens=7_000, out=1_000), 0.0)[0], Dispatch)
    assert isinstance(c.arrive(req("other", tokens=70_000, out=2_000), 0.0)[0], Dispatch)


def test_engine_refusal_releases_the_seat_at_once() -> None:
    c = core([BackendView("b0", kv_tokens=10_000)], admit_water=1.0, high_water=1.0)
    [d] = c.arrive(req(tokens=8_000, out=1_000, conv="big"), 0.0)
    waiter = req("other", tokens=4_000, out=100, conv="small")
    assert c.arrive(waiter, 0.1) == []  # no room while "big" holds its seat
    decisions = c.finish(d.rid, Outcome(ok=False, refused=True), 0.2)
    assert [x.rid for x in decisions if isinstance(x, Dispatch)] == [waiter.rid]
    assert "big" not in c.seats


def test_a_refused_outcome_is_not_needed_for_a_normal_finish_to_keep_its_seat() -> None:
    c = core([BackendView("b0", kv_tokens=10_000)], admit_water=1.0, high_water=1.0)
    [d] = c.arrive(req(tokens=8_000, out=1_000, conv="big"), 0.0)
    c.finish(d.rid, Outcome(prompt_tokens=8_000, completion_tokens=500), 0.2)
    assert "big" in c.seats  # kept through the think pause, as before


def test_blocked_head_keeps_its_slot_others_backfill_elsewhere() -> None:
    c = core(
        [BackendView("b0", kv_tokens=10_000), BackendView("b1", kv_tokens=10_000)],
        admit_water=1.0,
        high_water=1.0,
        min_hold_s=1e9,
    )
    c.arrive(req("x", tokens=5_900, conv="x0"), 0.0)  # b0: 6k
    c.arrive(req("x", tokens=7_900, conv="x1"), 0.0)  # b1: 8k
    head = req("big", tokens=6_000, out=100, conv="head")  # fits neither now; shortest of room on b0
    assert c.arrive(head, 1.0) == []
    small = req("y", tokens=1_500, out=100, conv="y")  # fits b0 (7.6k) and b1 (9.6k): must go to b1
    [d] = c.arrive(small, 1.1)
    assert isinstance(d, Dispatch) and d.backend == "b1"
    assert c.arrive(req("z", tokens=1_500, out=100, conv="z"), 1.2) == []  # only b0 has room: the head's
    assert head.rid in c.waiting


def test_one_slot_nothing_passes_the_head() -> None:
    c = core([BackendView("b0", kv_tokens=10_000)], admit_water=1.0, high_water=1.0, min_hold_s=1e9)
    c.arrive(req("x", tokens=5_900, conv="x0"), 0.0)
    assert c.arrive(req("big", tokens=6_000, conv="head"), 1.0) == []
    assert c.arrive(req("y", tokens=1_000, conv="y"), 1.1) == []


def test_pass_through_refuses_what_can_never_run_as_admission_does() -> None:
    """``--admission none``: the same 400s on arrival (shared ``never_runs``), against the whole KV
    pool (no seats, so no high-water headroom), and the team ceiling from the config."""
    c = PassThroughCore(RoundRobin())
    c.configure({"teams": {"small": {"max_request_tokens": 8_000}, "default": {"max_concurrency": 2}}})
    c.set_backends("m", [BackendView("b0", kv_tokens=65_536), BackendView("b1", kv_tokens=65_536)], 0.0)
    [r] = c.arrive(req(tokens=65_537, out=0), 0.0)
    assert isinstance(r, Refuse) and r.code == "context_length_exceeded" and r.status == 400
    assert r.retry_after_s == 0.0 and "KV cache" in r.message and c.inflight() == {}
    assert isinstance(c.arrive(req(tokens=65_536, out=0), 0.0)[0], Dispatch)  # the whole pool may hold it
    [r] = c.arrive(req("small", tokens=7_000, out=2_000), 0.0)
    assert isinstance(r, Refuse) and r.code == "team_request_tokens" and r.status == 400
    assert isinstance(c.arrive(req("small", tokens=7_000, out=1_000), 0.0)[0], Dispatch)
    c.set_team("small", TeamLimits(max_request_tokens=None))  # the admin API's runtime change
    assert isinstance(c.arrive(req("small", tokens=7_000, out=2_000), 0.0)[0], Dispatch)
    # a context window on one backend only: the other may take it; unhealthy backends do not count
    c.set_backends("m", [BackendView("b0", context_tokens=4_096), BackendView("b1", healthy=False)], 0.0)
    [r] = c.arrive(req(tokens=4_000, out=200), 0.0)
    assert isinstance(r, Refuse) and r.code == "context_length_exceeded" and "context window" in r.message
    c.set_backends("m", [BackendView("b0", context_tokens=4_096), BackendView("b1", context_tokens=8_192)], 0.0)
    [d] = c.arrive(req(tokens=4_000, out=200), 0.0)
    assert isinstance(d, Dispatch) and d.backend == "b1"
