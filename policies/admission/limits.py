"""Team limits at admission: concurrency caps, queue bounds and token rates, scaled by the share.

A request that can never run, or that passes the team's ``max_request_tokens``, is refused at the
door with 400 (``policies/request_limits.py``). A team may dispatch while ``inflight < cap``
(``cap = max_concurrency``, or
``max(1, ceil(max_concurrency · share))`` when concurrency is split between replicas) and no lease
refusal blocks it. A request is refused at the door when ``waiting ≥ max_queue`` (times ``share``,
rounded up, below 1) or when the team's token bucket (``tokens_per_minute · share``) cannot pay its
need. Limits and their defaults: ``policies/teams.py::TeamLimits``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from policies.request_limits import never_runs
from policies.teams import TeamState
from policies.types import BackendView, Refuse, RequestFacts


class TeamGate:
    """The team checks of ``SeatedAdmission``; mixed in, it reads the core's share."""

    share: float
    split_concurrency: bool

    def _cap(self, team: TeamState) -> int:
        limit = team.limits.max_concurrency
        if not self.split_concurrency or limit <= 0 or self.share >= 1.0:
            return limit
        return max(1, math.ceil(limit * self.share))

    def _may_dispatch(self, team: TeamState, now: float) -> bool:
        return team.inflight < self._cap(team) and team.blocked_until <= now

    def _refuse_at_door(
        self,
        req: RequestFacts,
        team: TeamState,
        need: int,
        now: float,
        views: Iterable[BackendView] = (),
        high_water: float = 1.0,
    ) -> Refuse | None:
        """A request that can never run (``policies/request_limits.py``: 400 at once, it would block the
        seat queue), then the queue bound, then the token rate (which takes ``need`` tokens when it lets it in)."""
        never = never_runs(req, views, high_water, team.limits)
        if never is not None:
            return never
        queue_cap = team.limits.max_queue if self.share >= 1.0 else math.ceil(team.limits.max_queue * self.share)
        if team.waiting >= queue_cap:
            return Refuse(
                req.rid,
                "team_queue_full",
                f"team '{req.team}' has {team.waiting} requests waiting (limit {queue_cap})",
                team.retry_after(team.waiting),
            )
        wait = team.take_tokens(need, now, self.share)
        if wait > 0:
            return Refuse(
                req.rid,
                "team_token_rate",
                f"team '{req.team}' is over its {team.limits.tokens_per_minute} tokens per minute",
                wait,
            )
        return None
