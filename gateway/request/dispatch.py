"""The waiting room: drives the decision core from asyncio.

A request that must wait holds a future; a ``Dispatch`` or ``Refuse`` decision from the core
resolves it. Everything a request takes here is given back through ``release`` or ``cancel``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from backends.aio import cancel_and_wait
from gateway.state.replicas import MemoryState, RedisState
from policies.core import DecisionCore
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts


class Waiting(Protocol):
    """What ``admit`` counts a waiting request on (a labelled Prometheus gauge)."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class Refused(Exception):
    def __init__(self, refusal: Refuse) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


class Dispatcher:
    def __init__(
        self,
        core: DecisionCore,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.1,
        state: MemoryState | RedisState | None = None,
    ) -> None:
        self.core = core
        self.clock = clock
        self.tick_s = tick_s
        self.state = state or MemoryState()
        self._waiting: dict[str, asyncio.Future[Decision]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.on_decision: Callable[[Decision], None] | None = None
        # Team leases exist only where the core keeps team limits (the admission stacks).
        self._leases = "team" in core.hooks and self.state.shared
        self._teams: dict[str, str] = {}
        self.leasing: dict[str, str] = {}
        """rid -> team of requests the core dispatched that still wait for their team lease (they
        hold no slot yet: /admin/state does not count them in flight)."""
        self._pending: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The loop it was started on: asyncio.get_running_loop() checks the pid (a getpid syscall)."""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await cancel_and_wait([self._ticker])  # its loop's finally forgets it
        self._loop = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def set_backends(self, model: str, views: Sequence[BackendView]) -> None:
        self._apply(self.core.set_backends(model, views, self.clock()))

    async def admit(self, facts: RequestFacts, queued: Waiting | None = None) -> Dispatch:
        """Wait until the core dispatches this request; raise ``Refused`` if it refuses it.
        ``queued`` (a gauge) counts it while it waits; a request dispatched at once never waits
        (nothing could see it counted: a scrape runs between the loop's steps)."""
        first = self.admit_now(facts)
        return first if isinstance(first, Dispatch) else await self.wait(facts, first, queued)

    def admit_now(self, facts: RequestFacts) -> Dispatch | asyncio.Future[Decision]:
        """``admit`` in two steps, for a caller that would rather not start a coroutine for the
        common case: the request's dispatch if the core gives it at once (and no team lease is to
        be taken), else the future to hand to ``wait`` (at once: nothing else may run between)."""
        decisions = self.core.arrive(facts, self.clock())
        if not self._leases and len(decisions) == 1:
            decision = decisions[0]
            if decision.rid == facts.rid and isinstance(decision, Dispatch):
                if self.on_decision:
                    self.on_decision(decision)
                return decision
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        self._park(facts.rid, future)
        self._apply(decisions)
        return future

    def _park(self, rid: str, future: asyncio.Future[Decision]) -> None:
        """``rid`` waits on ``future``; the tick loop runs while anyone waits (an idle worker does not
        wake ten times a second for nothing)."""
        self._waiting[rid] = future
        if self._ticker is None and self._loop is not None:
            self._ticker = self._loop.create_task(self._tick_loop(), name="dispatch-tick")

    async def wait(
        self, facts: RequestFacts, future: asyncio.Future[Decision], queued: Waiting | None = None
    ) -> Dispatch:
        """The second step of ``admit``: wait on ``future`` from ``admit_now`` (see ``admit``)."""
        loop = self._loop or asyncio.get_running_loop()
        counted = False
        try:
            while True:
                if queued is not None and not counted and not future.done():
                    queued.inc()
                    counted = True
                try:
                    decision = await future
                except asyncio.CancelledError:
                    if self._waiting.pop(facts.rid, None) is not None:
                        self._apply(self.core.cancel(facts.rid, self.clock()))
                    elif future.done() and not future.cancelled() and isinstance(future.result(), Dispatch):
                        # Dispatched in the same instant the client left: give the seat back.
                        self.release(facts.rid, Outcome(ok=False, reached_backend=False))
                    raise
                if isinstance(decision, Refuse):
                    raise Refused(decision)
                if not self._leases:
                    return decision
                if queued is not None and not counted:
                    queued.inc()  # the team lease is a Redis round trip away
                    counted = True
                self.leasing[facts.rid] = facts.team
                try:
                    leased = await self._lease(facts)
                finally:
                    self.leasing.pop(facts.rid, None)
                if leased:
                    return decision
                # Another replica holds the team's leases: wait again, woken by a release anywhere.
                future = loop.create_future()
                self._park(facts.rid, future)
                self._apply(self.core.requeue(facts.rid, self.clock()))
        finally:
            if counted and queued is not None:
                queued.dec()

    async def _lease(self, facts: RequestFacts) -> bool:
        team = self.core.team(facts.team, self.clock())
        limit = team.limits.max_concurrency if team is not None else 0
        try:
            ok = await self.state.acquire(facts.team, facts.rid, limit)
        except asyncio.CancelledError:
            self._spawn(self.state.release(facts.team, facts.rid))
            self.release(facts.rid, Outcome(ok=False, reached_backend=False))
            raise
        if ok:
            self._teams[facts.rid] = facts.team
        return ok

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def wake(self, team: str) -> None:
        self._apply(self.core.wake(team, self.clock()))

    def set_share(self, share: float, split: bool) -> None:
        self._apply(self.core.set_share(share, split, self.clock()))

    def retry(self, rid: str, failed_backend: str) -> Dispatch | Refuse:
        decisions = self.core.retry(rid, failed_backend, self.clock())
        mine = next((d for d in decisions if d.rid == rid), None)
        self._apply(d for d in decisions if d.rid != rid)
        if mine is None:
            return Refuse(rid, "no_healthy_backend", "no other healthy backend to retry on", 5.0, 503)
        if self.on_decision:
            self.on_decision(mine)
        return mine

    def first_token(self, rid: str) -> None:
        self._apply(self.core.first_token(rid, self.clock()))

    def release(self, rid: str, outcome: Outcome) -> None:
        team = self._teams.pop(rid, None)
        if team is not None:
            self._spawn(self.state.release(team, rid))
        self._apply(self.core.finish(rid, outcome, self.clock()))

    def _apply(self, decisions: Iterable[Decision]) -> None:
        for decision in decisions:
            future = self._waiting.pop(decision.rid, None)
            if future is None or future.done():
                if isinstance(decision, Dispatch):
                    # Its client already left: nothing will use this dispatch.
                    self._apply(self.core.finish(decision.rid, Outcome(ok=False, reached_backend=False), self.clock()))
                continue
            if self.on_decision:
                self.on_decision(decision)
            future.set_result(decision)

    def tick(self) -> None:
        """The core's clock event, sent while anyone waits (``loadtest/sim/driver.py`` does the same)."""
        if self._waiting:
            self._apply(self.core.tick(self.clock()))

    async def _tick_loop(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(self.tick_s)
                self.tick()
        finally:
            self._ticker = None
