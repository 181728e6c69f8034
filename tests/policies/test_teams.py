"""policies/teams.py: team limits from a config mapping, and one team's counters (virtual token
counter, dispatch rate, token bucket), time passed in."""

from __future__ import annotations

import pytest

from policies.teams import UNLIMITED, TeamLimits, TeamState, teams_from_config


def test_teams_from_config_keeps_defaults_for_unset_and_none_fields() -> None:
    teams = teams_from_config(
        {"teams": {"a": {"max_concurrency": 2, "weight": None}, "default": {"max_queue": 5}, 7: None}}
    )
    assert teams["a"] == TeamLimits(max_concurrency=2)  # weight None: the default 1.0
    assert teams["default"] == TeamLimits(max_queue=5)
    assert teams["7"] == TeamLimits()  # names are strings; no fields: every default
    assert teams_from_config({}) == {} and teams_from_config({"teams": None}) == {}


def test_teams_from_config_rejects_an_unknown_field() -> None:
    with pytest.raises(TypeError):
        teams_from_config({"teams": {"a": {"max_concurency": 2}}})


def test_unlimited_is_past_any_real_limit() -> None:
    assert UNLIMITED.max_concurrency >= 1_000_000 and UNLIMITED.max_queue >= 1_000_000
    assert UNLIMITED.queue_timeout_s >= 1e12 and UNLIMITED.tokens_per_minute is None


def test_a_team_is_active_while_it_runs_or_waits() -> None:
    t = TeamState("t", TeamLimits(), 0.0)
    assert not t.active
    t.waiting = 1
    assert t.active
    t.waiting, t.inflight = 0, 1
    assert t.active


def test_the_counter_is_charged_tokens_over_weight() -> None:
    t = TeamState("t", TeamLimits(weight=4.0), 0.0)
    t.charge(1000)
    t.charge(200)
    assert t.vtc == pytest.approx(300.0)
    t.charge(-200)  # a dispatch taken back
    assert t.vtc == pytest.approx(250.0)


def test_dispatch_interval_is_an_ewma_of_the_gaps() -> None:
    t = TeamState("t", TeamLimits(), 0.0)
    t.dispatched(10.0)  # the first dispatch has no gap yet
    assert t.dispatch_interval == 5.0 and t.last_dispatch == 10.0
    t.dispatched(11.0)
    assert t.dispatch_interval == pytest.approx(5.0 + 0.2 * (1.0 - 5.0))
    before = t.dispatch_interval
    t.dispatched(11.0)  # a zero gap counts as 1 ms
    assert t.dispatch_interval == pytest.approx(before + 0.2 * (1e-3 - before))


def test_retry_after_is_the_position_times_the_interval_clipped() -> None:
    t = TeamState("t", TeamLimits(), 0.0)
    assert t.retry_after(0) == 5.0
    assert t.retry_after(3) == 20.0
    assert t.retry_after(1000) == 300.0
    t.dispatch_interval = 0.01
    assert t.retry_after(0) == 1.0


def test_without_a_rate_every_take_is_granted() -> None:
    t = TeamState("t", TeamLimits(), 0.0)
    assert t.take_tokens(10**9, 0.0) == 0.0
    assert t.bucket == 0.0


def test_the_bucket_starts_full_refills_continuously_and_says_how_long_to_wait() -> None:
    t = TeamState("t", TeamLimits(tokens_per_minute=600), 0.0)
    assert t.take_tokens(600, 0.0) == 0.0  # a full minute's budget at once
    assert t.take_tokens(60, 0.0) == pytest.approx(6.0)  # 60 tokens at 10 per second
    assert t.take_tokens(60, 3.0) == pytest.approx(3.0)  # 30 refilled: 30 more to go
    assert t.take_tokens(60, 6.0) == 0.0
    assert t.bucket == pytest.approx(0.0)
    assert t.take_tokens(10, 1000.0) == 0.0
    assert t.bucket == pytest.approx(590.0)  # refilled to the rate, not past it


def test_a_share_scales_the_rate_and_the_bucket() -> None:
    t = TeamState("t", TeamLimits(tokens_per_minute=600), 0.0)
    assert t.take_tokens(250, 0.0, share=0.5) == 0.0  # the full bucket is capped at half the rate: 300
    assert t.take_tokens(100, 0.0, share=0.5) == pytest.approx((100 - 50) * 60 / 300)
    whole = TeamState("t", TeamLimits(tokens_per_minute=600), 0.0)
    assert whole.take_tokens(250, 0.0) == 0.0 and whole.take_tokens(100, 0.0) == 0.0


def test_a_request_larger_than_the_whole_budget_passes_only_on_a_full_bucket() -> None:
    t = TeamState("t", TeamLimits(tokens_per_minute=600), 0.0)
    assert t.take_tokens(100, 0.0) == 0.0
    assert t.take_tokens(1000, 0.0) > 0  # not full: refused, with the wait
    assert t.take_tokens(1000, 60.0) == 0.0  # full again: it passes, never forever refused
    assert t.bucket == pytest.approx(-400.0)  # and the debt delays what follows
    assert t.take_tokens(100, 60.0) == pytest.approx(500 * 60 / 600)
