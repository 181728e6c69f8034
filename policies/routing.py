"""Routers: where a request goes once it may go.

A router is a pure object: it sees the request's facts and the backends' views, keeps whatever
it learns in memory, and never does I/O. The live gateway and the simulator call the same ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, Literal

from policies.prefix_index import PrefixIndex
from policies.types import BackendView, Dispatch, Outcome, RequestFacts

RouterHook = Literal["dispatched", "first_token", "finished", "matched_tokens", "swap_index"]
"""The optional hooks of ``Router`` (each has a no-op default)."""

ROUTER_HOOKS: tuple[RouterHook, ...] = ("dispatched", "first_token", "finished", "matched_tokens", "swap_index")


class Router(ABC):
    """The routing contract: ``route`` is required; the other hooks default to doing nothing, and a
    router names those it implements in ``hooks``."""

    name: str
    hooks: ClassVar[frozenset[RouterHook]] = frozenset()

    @abstractmethod
    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        """Pick a backend (and rank) among ``backends`` (all healthy, not excluded); None if none fits.
        A router that knows how much of the prompt the pick holds says so in ``Dispatch.matched_tokens``."""

    def dispatched(self, req: RequestFacts, decision: Dispatch, now: float) -> None:
        """``req`` was sent per ``decision`` (count its work now, not at the next load poll)."""
        return None

    def first_token(self, rid: str, now: float) -> None:
        """The engine produced ``rid``'s first token (prefill done: learn the prefill rate)."""
        return None

    def finished(self, rid: str, backend: str, outcome: Outcome, now: float) -> None:
        """Learn from a request that ended on ``backend`` (insert its prefix, free its load)."""
        return None

    def matched_tokens(self, req: RequestFacts, backend: str, rank: int | None) -> int | None:
        """Tokens of ``req``'s prompt this router believes ``backend`` (``rank``) holds; None when the
        router keeps no prefix index. Admission asks it for a turn that goes to its seat unrouted."""
        return None

    def swap_index(self, make: Callable[[PrefixIndex], PrefixIndex]) -> PrefixIndex | None:
        """Replace the router's prefix index by ``make(index)`` and return the new one (the exact
        cache view, policies/kv_view.py); None when the router keeps no prefix index."""
        return None


class RoundRobin(Router):
    """Plain round-robin over healthy backends.

    Formula: the i-th routed request goes to ``healthy[i mod n]``; with ``over_ranks`` the cycle
    runs over every (backend, DP rank) pair instead, so each rank gets ``1/Σdp`` of the requests.

    Parameters: ``over_ranks`` (default False: the backend picks its own rank, as SGLang's DP
    controller does by round-robin when the request names none).
    """

    def __init__(self, *, over_ranks: bool = False) -> None:
        self.name = "round-robin" if over_ranks else "direct"
        self.over_ranks = over_ranks
        self._next = 0

    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        if not backends:
            return None
        if self.over_ranks:
            slots = [(b.name, r) for b in backends for r in range(max(1, b.dp_size))]
            name, rank = slots[self._next % len(slots)]
            self._next += 1
            return Dispatch(req.rid, name, rank if any(b.dp_size > 1 for b in backends) else None, reason="least_wait")
        backend = backends[self._next % len(backends)]
        self._next += 1
        return Dispatch(req.rid, backend.name, None, reason="least_wait")
