"""Per-team limits and the counters the fair queue orders by.

Pure: time is passed in. The gateway fills ``TeamLimits`` from its config (and the admin API);
the simulator from ``--teams`` / ``--config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TeamLimits:
    max_concurrency: int = 8
    """Requests of the team dispatched and not finished (0: none may run)."""
    max_queue: int = 32
    """Requests of the team waiting in admission; one more is refused at once (``team_queue_full``). The
    bound is checked at the door, before a request could be dispatched: 0 refuses every request."""
    queue_timeout_s: float = 60.0
    """A request waiting longer is refused (``queue_timeout``)."""
    weight: float = 1.0
    """Fair share relative to other teams (tokens served are divided by it)."""
    priority: int = 0
    """Band: every waiting request of a higher band goes before any of a lower one."""
    tokens_per_minute: int | None = None
    """Optional token budget (prompt + expected output), refilled continuously (``team_token_rate``)."""
    max_request_tokens: int | None = None
    """Optional ceiling on one request's prompt + max_tokens; past it: 400 ``team_request_tokens``."""
    max_wait_s: float = 300.0
    """The wait bound admission plans for (not a timeout that refuses): a waiting request is dispatched
    before it has waited this long, at a throughput cost if need be (``policies/admission``). 240 s: a
    turn's first token then comes within Codex CLI's ~300 s stream idle timeout (and well within Claude
    Code's ~600 s request timeout) even after a full recompute of a 250k-token context."""


UNLIMITED = TeamLimits(max_concurrency=1_000_000, max_queue=1_000_000, queue_timeout_s=1e12)


def teams_from_config(config: Mapping[str, object]) -> dict[str, TeamLimits]:
    """``TeamLimits`` by team from a core's config mapping (``teams: {name: {...}}``; unset fields
    keep their defaults). The ``default`` entry, if any, is the limits of teams not listed."""
    teams = config.get("teams") or {}
    assert isinstance(teams, Mapping)
    return {
        str(name): TeamLimits(**{k: v for k, v in dict(fields or {}).items() if v is not None})
        for name, fields in teams.items()
    }


class TeamState:
    """Counters of one team: in flight, waiting, its virtual token counter, its token bucket.

    Virtual token counter (VTC, Sheng et al., OSDI '24): ``vtc += tokens / weight`` for every
    request the team gets served; the waiting team with the lowest counter goes first, so a team
    sending huge prompts gets the same *tokens* as others, not the same requests. A team that
    comes back after being idle has its counter lifted to the lowest active counter, so idleness
    is not banked as credit.

    Drain rate: an exponentially weighted rate of the team's dispatches (``alpha`` 0.2 per
    dispatch), used to compute ``Retry-After``.
    """

    def __init__(self, name: str, limits: TeamLimits, now: float) -> None:
        self.name = name
        self.limits = limits
        self.inflight = 0
        self.waiting = 0
        self.vtc = 0.0
        self.bucket = float(limits.tokens_per_minute or 0)
        self.refilled_at = now
        self.last_dispatch: float | None = None
        self.dispatch_interval = 5.0
        self.blocked_until = 0.0
        """A dispatch was refused its lease (another replica holds the team's leases): hold off until then."""

    @property
    def active(self) -> bool:
        return self.inflight > 0 or self.waiting > 0

    def charge(self, tokens: float) -> None:
        self.vtc += tokens / self.limits.weight

    def dispatched(self, now: float) -> None:
        if self.last_dispatch is not None:
            self.dispatch_interval += 0.2 * (max(now - self.last_dispatch, 1e-3) - self.dispatch_interval)
        self.last_dispatch = now

    def retry_after(self, position: int) -> float:
        """Seconds until a request at ``position`` in the team's queue would likely be dispatched."""
        return min(300.0, max(1.0, (position + 1) * self.dispatch_interval))

    def take_tokens(self, tokens: int, now: float, share: float = 1.0) -> float:
        """Take ``tokens`` from the bucket (``share`` of the team's rate: this replica's part);
        0.0 if granted, else the seconds until they would be."""
        if not self.limits.tokens_per_minute:
            return 0.0
        rate = self.limits.tokens_per_minute * share
        self.bucket = min(float(rate), self.bucket + (now - self.refilled_at) * rate / 60.0)
        self.refilled_at = now
        if tokens <= self.bucket or (self.bucket >= rate and tokens > rate):
            # A request larger than the whole budget passes only on a full bucket, never forever refused.
            self.bucket -= tokens
            return 0.0
        return (tokens - self.bucket) * 60.0 / rate
