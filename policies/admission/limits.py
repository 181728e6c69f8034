"""Team limits at admission: concurrency caps, queue bounds and token rates, scaled by the share.

A team may dispatch while ``inflight < cap`` (``cap = max_concurrency``, or
``max(1, ceil(max_concurrency · share))`` when concurrency is split between replicas) and no lease
refusal blocks it. A request is refused at the door when ``waiting ≥ max_queue`` (times ``share``,
rounded up, below 1) or when the team's token bucket (``tokens_per_minute · share``) cannot pay its
need. Limits and their defaults: ``policies/teams.py::TeamLimits``.
"""

from __future__ import annotations

import math

from policies.teams import TeamState
from policies.types import Refuse, RequestFacts


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

    def _refuse_at_door(self, req: RequestFacts, team: TeamState, need: int, now: float) -> Refuse | None:
        """The queue bound, then the token rate (which takes ``need`` tokens when it lets it in)."""
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
