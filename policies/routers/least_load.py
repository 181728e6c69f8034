"""``least-load``: the load-aware balancer the comparison tables carry."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from policies.routers.base import Inflight, make_dispatch, slot_of, slots_of
from policies.routing import Router, RouterHook
from policies.types import BackendView, Dispatch, Outcome, RequestFacts


class LeastLoad(Router):
    """Fewest in-flight requests, per (backend, DP rank).

    Formula: pick ``argmin_s inflight(s)`` over every rank of every candidate backend, where
    ``inflight`` counts this router's own dispatches (taken at dispatch, released at finish, so a
    burst cannot pile onto one backend between load polls); ties are broken at random (never to
    the first backend: the peers' hot-spot bug). No prefix awareness.

    Parameters: ``seed`` of the tie-break RNG (default 0).
    """

    name = "least-load"
    hooks: ClassVar[frozenset[RouterHook]] = frozenset({"dispatched", "finished"})

    def __init__(self, *, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._inflight = Inflight()

    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        slots = slots_of(backends)
        if not slots:
            return None
        low = min(self._inflight.count(s) for s, _ in slots)
        slot, _ = self._rng.choice([(s, b) for s, b in slots if self._inflight.count(s) == low])
        return make_dispatch(req.rid, slot, "least_wait", {"inflight": float(low)})

    def dispatched(self, req: RequestFacts, decision: Dispatch, now: float) -> None:
        self._inflight.add(req.rid, slot_of(decision))

    def finished(self, rid: str, backend: str, outcome: Outcome, now: float) -> None:
        self._inflight.remove(rid)
