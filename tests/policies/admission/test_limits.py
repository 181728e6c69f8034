"""policies/admission/limits.py: team caps, queue bounds and token rates at the door, scaled by this
replica's share (``TeamGate``, hosted here by the smallest object that has a share)."""

from __future__ import annotations

import pytest

from policies.admission.limits import TeamGate
from policies.teams import TeamLimits, TeamState
from policies.types import BackendView, RequestFacts


class _Gate(TeamGate):
    def __init__(self, share: float = 1.0, split_concurrency: bool = False) -> None:
        self.share = share
        self.split_concurrency = split_concurrency


def _team(**limits: float | int | None) -> TeamState:
    return TeamState("t", TeamLimits(**limits), 0.0)  # type: ignore[arg-type]


def _req(tokens: int = 100, out: int = 0) -> RequestFacts:
    return RequestFacts(rid="r", model="m", team="t", prompt_tokens=tokens, max_output_tokens=out)


@pytest.mark.parametrize(
    ("limit", "share", "split", "cap"),
    [
        (8, 1.0, True, 8),
        (8, 0.5, False, 8),  # leases in Redis enforce the whole limit: no split
        (8, 0.5, True, 4),
        (8, 0.3, True, 3),  # rounded up
        (2, 0.1, True, 1),  # never below one
        (0, 0.5, True, 0),  # none may run stays none
    ],
)
def test_concurrency_cap_is_split_only_when_asked(limit: int, share: float, split: bool, cap: int) -> None:
    gate = _Gate(share, split)
    assert gate._cap(_team(max_concurrency=limit)) == cap


def test_a_team_may_dispatch_under_its_cap_and_not_while_blocked() -> None:
    gate = _Gate()
    team = _team(max_concurrency=2)
    assert gate._may_dispatch(team, 0.0)
    team.inflight = 2
    assert not gate._may_dispatch(team, 0.0)
    team.inflight = 1
    team.blocked_until = 5.0  # a lease was refused elsewhere
    assert not gate._may_dispatch(team, 4.9) and gate._may_dispatch(team, 5.0)


def test_the_queue_bound_refuses_with_a_retry_after() -> None:
    gate = _Gate()
    team = _team(max_queue=3)
    team.waiting = 2
    assert gate._refuse_at_door(_req(), team, 100, 0.0) is None
    team.waiting = 3
    refused = gate._refuse_at_door(_req(), team, 100, 0.0)
    assert refused is not None and refused.code == "team_queue_full" and refused.status == 429
    assert "limit 3" in refused.message and refused.retry_after_s == team.retry_after(3)


def test_the_queue_bound_is_this_replicas_share_rounded_up() -> None:
    team = _team(max_queue=5)
    team.waiting = 2
    assert _Gate(share=0.5)._refuse_at_door(_req(), team, 100, 0.0) is None  # ceil(2.5) = 3
    team.waiting = 3
    refused = _Gate(share=0.5)._refuse_at_door(_req(), team, 100, 0.0)
    assert refused is not None and "limit 3" in refused.message


def test_the_token_rate_takes_the_need_and_refuses_past_it() -> None:
    gate = _Gate()
    team = _team(tokens_per_minute=1000)
    assert gate._refuse_at_door(_req(), team, 600, 0.0) is None
    assert team.bucket == pytest.approx(400.0)  # let in: its need was taken
    refused = gate._refuse_at_door(_req(), team, 600, 0.0)
    assert refused is not None and refused.code == "team_token_rate"
    assert refused.retry_after_s == pytest.approx(200 * 60 / 1000)
    assert "1000 tokens per minute" in refused.message


def test_the_token_rate_is_this_replicas_share() -> None:
    team = _team(tokens_per_minute=1000)
    refused = _Gate(share=0.5)._refuse_at_door(_req(), team, 600, 0.0)  # a full bucket of 500 < 600 ≤ 1000
    assert refused is None  # larger than the whole (shared) bucket: passes on a full one
    team2 = _team(tokens_per_minute=1000)
    assert _Gate(share=0.5)._refuse_at_door(_req(), team2, 400, 0.0) is None
    refused = _Gate(share=0.5)._refuse_at_door(_req(), team2, 400, 0.0)
    assert refused is not None and refused.retry_after_s == pytest.approx(300 * 60 / 500)


def test_what_can_never_run_is_refused_first_and_takes_no_tokens() -> None:
    gate = _Gate()
    team = _team(max_queue=0, tokens_per_minute=1000, max_request_tokens=5000)
    views = [BackendView("b0", kv_tokens=1000)]
    never = gate._refuse_at_door(_req(tokens=2000), team, 2000, 0.0, views, high_water=1.0)
    assert never is not None and (never.code, never.status) == ("context_length_exceeded", 400)
    ceiling = gate._refuse_at_door(_req(tokens=900, out=4200), team, 5100, 0.0, views)
    assert ceiling is not None and ceiling.code == "team_request_tokens"
    assert team.bucket == 1000  # neither touched the token bucket
    full = gate._refuse_at_door(_req(tokens=500), team, 500, 0.0, views)
    assert full is not None and full.code == "team_queue_full"  # then the queue bound, before the rate
    assert team.bucket == 1000


def test_high_water_is_the_most_a_seat_may_hold() -> None:
    gate = _Gate()
    views = [BackendView("b0", kv_tokens=1000)]
    assert gate._refuse_at_door(_req(tokens=900), _team(), 900, 0.0, views, high_water=1.0) is None
    refused = gate._refuse_at_door(_req(tokens=900), _team(), 900, 0.0, views, high_water=0.8)
    assert refused is not None and refused.code == "context_length_exceeded"
