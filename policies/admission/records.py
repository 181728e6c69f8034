"""The records admission keeps: seats, waiters, running dispatches, placements, a model's views."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.types import BackendView, RequestFacts, Slot


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
