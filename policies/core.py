"""The decision core: the one object that decides what waits, what goes, and where.

It takes events with the time passed in and answers with decisions (``Dispatch``, ``Refuse``).
The gateway drives it from asyncio (a waiting request holds a future that a decision resolves);
the simulator drives the very same object from its event loop.

The contract is the base class ``DecisionCore``: seven events every core handles (abstract), and
optional hooks whose defaults do nothing (as SGLang's router trait). A core names the hooks it
implements in ``hooks``; callers never probe a core for a method. ``tests/policies`` checks that
each registered core's ``hooks`` is exactly the set of hooks it overrides.

| event | sent by | when |
| --- | --- | --- |
| ``set_backends`` | pool (gateway), simulator | a backend's health, load or capacity changed |
| ``arrive`` | request path, simulator | a request arrived |
| ``first_token`` | relay, simulator | the engine produced the request's first token |
| ``finish`` | request path, simulator | a dispatched request ended (``Outcome``) |
| ``cancel`` | dispatcher | a request still waiting left (its client went away) |
| ``retry`` | upstream attempts | a dispatch failed before anything reached the backend |
| ``tick`` | dispatcher, simulator | time passed |
| hook ``configure`` | gateway start, simulator | team limits and admission parameters from the config |
| hook ``set_team`` | admin API, shared state | a team's limits changed at run time |
| hook ``set_share`` | shared state | this replica's share of the limits changed |
| hook ``wake`` | shared state | a team lease was released on some replica |
| hook ``requeue`` | dispatcher | a dispatch could not take its team lease: wait again |
| query ``team`` / ``teams`` / ``limits`` | dispatcher (lease size), admin API | team counters and limits |
| query ``snapshot`` | admin API | the core's state, for people |
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Literal

from policies.request_limits import fits, never_runs
from policies.routing import Router
from policies.teams import TeamLimits, TeamState, teams_from_config
from policies.types import BackendView, Decision, Outcome, Refuse, RequestFacts

Hook = Literal["configure", "set_team", "set_share", "wake", "requeue", "team", "snapshot"]
"""The optional hooks of ``DecisionCore`` (each has a no-op default)."""

HOOKS: tuple[Hook, ...] = ("configure", "set_team", "set_share", "wake", "requeue", "team", "snapshot")


class DecisionCore(ABC):
    """The contract between the decision core and whoever drives it (gateway or simulator)."""

    name: str
    hooks: ClassVar[frozenset[Hook]] = frozenset()
    """The optional hooks this core implements; the others are the no-op defaults below."""
    router: Router
    """Where a dispatched request goes (policies/routing.py)."""
    teams: Mapping[str, TeamState] = MappingProxyType({})
    """Counters of the teams this core has seen (empty: the core keeps no team state)."""
    limits: Mapping[str, TeamLimits] = MappingProxyType({})
    """Team limits in force, by team (runtime changes included); teams not listed get the default."""

    # ----- events every core handles --------------------------------------------------------------

    @abstractmethod
    def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
        """The pool's view of ``model``'s backends changed (health, load, capacity)."""

    @abstractmethod
    def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
        """A request arrived; decisions may concern it or others."""

    @abstractmethod
    def first_token(self, rid: str, now: float) -> list[Decision]:
        """The engine produced ``rid``'s first token (its prefill is done)."""

    @abstractmethod
    def finish(self, rid: str, outcome: Outcome, now: float) -> list[Decision]:
        """A dispatched request ended (completed, failed or cancelled by its client)."""

    @abstractmethod
    def cancel(self, rid: str, now: float) -> list[Decision]:
        """A request that has not been dispatched left (its client went away)."""

    @abstractmethod
    def retry(self, rid: str, failed_backend: str, now: float) -> list[Decision]:
        """A dispatch failed before anything reached the backend: route once more, elsewhere."""

    @abstractmethod
    def tick(self, now: float) -> list[Decision]:
        """Time passed: expire waits, hand out freed seats."""

    # ----- optional hooks (no-op defaults; a core lists those it implements in ``hooks``) ---------

    def configure(self, config: Mapping[str, object]) -> None:
        """Team limits and admission parameters from a config mapping: ``teams: {name: {...}}`` (the
        ``default`` entry applies to teams not listed) and ``admission: {...}``. Default: ignored."""
        return None

    def set_team(self, name: str, limits: TeamLimits, now: float = 0.0) -> None:
        """Change a team's limits at run time. Default: ignored (the core has no team limits)."""
        return None

    def set_share(self, share: float, split_concurrency: bool, now: float) -> list[Decision]:
        """This replica's share (1 / live replicas) of the limits; ``split_concurrency`` when team
        concurrency must be split too (Redis unreachable). Default: ignored."""
        return []

    def wake(self, team: str, now: float) -> list[Decision]:
        """A lease of ``team`` was released somewhere: its requeued requests may try again."""
        return []

    def requeue(self, rid: str, now: float) -> list[Decision]:
        """A dispatch could not take its team lease: the request waits again. Only sent to a core
        whose ``team`` answers (a core without team limits takes no leases)."""
        return []

    def team(self, name: str, now: float) -> TeamState | None:
        """Team ``name``'s counters and limits; None when the core keeps no team limits (then the
        gateway takes no team leases for it)."""
        return None

    def snapshot(self) -> dict[str, object]:
        """The core's state for the admin API (``/admin/state``)."""
        return {}


class PassThroughCore(DecisionCore):
    """No admission: every request is routed the moment it arrives.

    This is the ``direct``, ``round-robin``, ``least-load`` and ``sglang-cache-aware`` stacks:
    the decision is the router's alone, and a request waits only inside the engine.
    Refuses with ``no_healthy_backend`` (503) when the model has no healthy backend, and at once
    with 400 a request that can never run (``policies/request_limits.py``, as the admission core:
    ``context_length_exceeded`` against every healthy backend's context window and whole KV pool,
    ``team_request_tokens`` past the team's ``max_request_tokens``): the engine would only refuse it
    after queueing it. Hooks: ``configure`` and ``set_team`` (for ``max_request_tokens``; the other
    team limits are not enforced, and no team leases are taken: ``team`` answers None).
    """

    hooks: ClassVar[frozenset[Hook]] = frozenset({"configure", "set_team"})

    def __init__(self, router: Router, name: str | None = None) -> None:
        self.router = router
        self.name = name or router.name
        self._backends: dict[str, list[BackendView]] = {}
        self._inflight: dict[str, tuple[str, RequestFacts]] = {}
        self.limits: dict[str, TeamLimits] = {}
        self._default = TeamLimits()

    def configure(self, config: Mapping[str, object]) -> None:
        """Only the teams' ``max_request_tokens`` matters here (the ``default`` entry for the others)."""
        for name, limits in teams_from_config(config).items():
            if name == "default":
                self._default = limits
            self.limits[name] = limits

    def set_team(self, name: str, limits: TeamLimits, now: float = 0.0) -> None:
        self.limits[name] = limits

    def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
        self._backends[model] = list(backends)
        return []

    def _route(self, req: RequestFacts, now: float, reason: str | None = None) -> list[Decision]:
        candidates = [
            b
            for b in self._backends.get(req.model, [])
            if b.healthy and b.name not in req.exclude and fits(req, b, 1.0)
        ]
        choice = self.router.route(req, candidates, now) if candidates else None
        if choice is None:
            return [
                Refuse(
                    req.rid,
                    "no_healthy_backend",
                    f"no healthy backend for model '{req.model}'",
                    retry_after_s=5.0,
                    status=503,
                )
            ]
        if reason is not None:
            choice = dataclasses.replace(choice, reason=reason)
        self._inflight[req.rid] = (choice.backend, req)
        self.router.dispatched(req, choice, now)
        return [choice]

    def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
        # high water 1: no seats here, the engine may fill its whole KV pool
        never = never_runs(req, self._backends.get(req.model, []), 1.0, self.limits.get(req.team, self._default))
        return [never] if never is not None else self._route(req, now)

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
        retried = dataclasses.replace(req, exclude=req.exclude | {failed_backend})
        return self._route(retried, now, reason="retry")

    def tick(self, now: float) -> list[Decision]:
        return []

    def inflight(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for backend, _ in self._inflight.values():
            counts[backend] = counts.get(backend, 0) + 1
        return counts
