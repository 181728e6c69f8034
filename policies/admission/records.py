"""The records admission keeps: seats, waiters, running dispatches, placements, a model's views."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from operator import itemgetter

from policies.teams import TeamState
from policies.types import BackendView, Fingerprint, RequestFacts, Slot


@dataclass(slots=True)
class Seat:
    key: str
    model: str
    slot: Slot
    team: str
    tokens: int
    since: float
    last_active: float
    busy: int = 0
    anchor: int | None = None
    one_shot: bool = False
    fp: Fingerprint = ()
    """The prompt blocks this seat holds on its slot (``blocks.py``: shared ones are reserved once)."""


@dataclass(slots=True)
class Waiter:
    req: RequestFacts
    key: str
    need: int
    arrived: float
    seq: int
    one_shot: bool


@dataclass(slots=True)
class Running:
    waiter: Waiter
    slot: Slot
    charged: float
    lent: bool = False


@dataclass(frozen=True, slots=True)
class Placement:
    slot: Slot
    reason: str
    scores: dict[str, float]
    matched_tokens: int | None = None


@dataclass(slots=True)
class ModelViews:
    """The backends of one model alias, by name, as the pool last reported them."""

    views: dict[str, BackendView] = field(default_factory=dict)


_TOKENS = itemgetter(1)


def conversation_of(req: RequestFacts, anchors: dict[int, str]) -> tuple[str, bool]:
    """The conversation a request continues: given by the caller, or found by the anchor (the last
    full block of a seated conversation's previous prompt) that this prompt extends. A match counts
    only if what follows the anchor is no longer than what precedes it: a turn adds one answer and
    one tool result to its history, while an anchor inside a shared system prompt would be followed
    by a whole other conversation."""
    if req.conversation:
        return req.conversation, False
    total = sum(map(_TOKENS, req.fingerprint))
    after = 0
    for key, tokens in reversed(req.fingerprint):
        conv = anchors.get(key)
        if conv is not None and after <= total - after:
            return conv, False
        after += tokens
        if after > total - after:
            break
    return f"rid:{req.rid}", not req.fingerprint


def waits_of(teams: dict[str, TeamState], waiters: dict[str, Waiter], now: float) -> dict[str, dict[str, float]]:
    """Per team: its oldest waiter's wait so far, the expected wait of a request arriving now (the team's
    queue times its mean dispatch interval, at most its bound) and the bound (``max_wait_s``)."""
    oldest: dict[str, float] = {}
    for w in waiters.values():
        oldest[w.req.team] = max(oldest.get(w.req.team, 0.0), now - w.arrived)
    return {
        n: {
            "oldest_wait_s": round(oldest.get(n, 0.0), 3),
            "expected_wait_s": round(min(t.limits.max_wait_s, t.waiting * t.dispatch_interval), 3),
            "max_wait_s": t.limits.max_wait_s,
        }
        for n, t in teams.items()
    }


def snapshot_of(
    teams: dict[str, TeamState],
    seats: dict[str, Seat],
    reserved: dict[Slot, int],
    waiters: dict[str, Waiter],
    running: int,
    now: float,
) -> dict[str, object]:
    """The admin API's view of admission: per team (with its waits, ``waits_of``), per slot (reserved
    tokens, seats), queue sizes."""
    waits = waits_of(teams, waiters, now)
    return {
        "teams": {
            n: {"inflight": t.inflight, "waiting": t.waiting, "vtc": round(t.vtc, 1), **waits[n]}
            for n, t in teams.items()
        },
        "backends": {
            f"{b}" if r is None else f"{b}#{r}": {
                "reserved_tokens": tokens,
                "seats": sum(1 for s in seats.values() if s.slot == (b, r)),
            }
            for (b, r), tokens in reserved.items()
        },
        "waiting": len(waiters),
        "running": running,
    }


def with_exclude(req: RequestFacts, backend: str) -> RequestFacts:
    """``req`` retried elsewhere: ``backend`` excluded."""
    return dataclasses.replace(req, exclude=req.exclude | {backend})
