"""The decision core: the one object that decides what waits, what goes, and where.

It takes events with the time passed in and answers with decisions (``Dispatch``, ``Refuse``).
The gateway drives it from asyncio (a waiting request holds a future that a decision resolves);
the simulator drives the very same object from its event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.routing import Router
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts


class DecisionCore(Protocol):
    name: str

    def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
        """The pool's view of ``model``'s backends changed (health, load, capacity)."""
        ...

    def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
        """A request arrived; decisions may concern it or others."""
        ...

    def first_token(self, rid: str, now: float) -> list[Decision]: ...

    def finish(self, rid: str, outcome: Outcome, now: float) -> list[Decision]:
        """A dispatched request ended (completed, failed or cancelled by its client)."""
        ...

    def cancel(self, rid: str, now: float) -> list[Decision]:
        """A request that has not been dispatched left (its client went away)."""
        ...

    def retry(self, rid: str, failed_backend: str, now: float) -> list[Decision]:
        """A dispatch failed before anything reached the backend: route once more, elsewhere."""
        ...

    def tick(self, now: float) -> list[Decision]:
        """Time passed: expire waits, hand out freed seats."""
        ...


class PassThroughCore:
    """No admission: every request is routed the moment it arrives.

    This is the ``direct``, ``round-robin``, ``least-load`` and ``sglang-cache-aware`` stacks:
    the decision is the router's alone, and a request waits only inside the engine.
    Refuses with ``no_healthy_backend`` (503) when the model has no healthy backend.
    """

    def __init__(self, router: Router, name: str | None = None) -> None:
        self.router = router
        self.name = name or router.name
        self._backends: dict[str, list[BackendView]] = {}
        self._inflight: dict[str, tuple[str, RequestFacts]] = {}

    def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
        self._backends[model] = list(backends)
        return []

    def _route(self, req: RequestFacts, now: float, reason: str | None = None) -> list[Decision]:
        candidates = [b for b in self._backends.get(req.model, []) if b.healthy and b.name not in req.exclude]
        choice = self.router.route(req, candidates, now) if candidates else None
        if choice is None:
            return [Refuse(req.rid, "no_healthy_backend", f"no healthy backend for model '{req.model}'",
                           retry_after_s=5.0, status=503)]
        if reason is not None:
            choice = Dispatch(choice.rid, choice.backend, choice.rank, reason, choice.scores)
        self._inflight[req.rid] = (choice.backend, req)
        self.router.dispatched(req, choice, now)
        return [choice]

    def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
        return self._route(req, now)

    def first_token(self, rid: str, now: float) -> list[Decision]:
        if rid in self._inflight:
            self.router.first_token(rid, now)
        return []

    def finish(self, rid: str, outcome: Outcome, now: float) -> list[Decision]:
        entry = self._inflight.pop(rid, None)
        if entry is not None:
            self.router.finished(rid, entry[0], outcome, now)
        return []

    def cancel(self, rid: str, now: float) -> list[Decision]:
        self._inflight.pop(rid, None)
        return []

    def retry(self, rid: str, failed_backend: str, now: float) -> list[Decision]:
        entry = self._inflight.pop(rid, None)
        if entry is None:
            return []
        backend, req = entry
        self.router.finished(rid, backend, Outcome(ok=False, reached_backend=False), now)
        retried = RequestFacts(**{**{f: getattr(req, f) for f in req.__slots__},
                                  "exclude": req.exclude | {failed_backend}})
        return self._route(retried, now, reason="retry")

    def tick(self, now: float) -> list[Decision]:
        return []

    def inflight(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for backend, _ in self._inflight.values():
            counts[backend] = counts.get(backend, 0) + 1
        return counts
