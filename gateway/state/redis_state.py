"""Team leases, live replicas and runtime limits shared through Redis (see ``gateway/state/replicas.py``).

Phases (``status()["phase"]``; ``mode`` is ``redis`` only in ``shared``):

- ``shared``: the leases in Redis enforce team concurrency; each replica may use the whole limit.
- ``unreachable``: the first failed call drops every pooled connection at once; the replica grants
  locally, first only within what Redis still counts for it (others may still be ``shared``), and
  ``grace_s`` after its last heartbeat (the others have seen it go stale) within its share,
  ``floor(limit / replicas)`` less the others' excess over theirs as last seen in ``shared`` mode;
  leases beyond its share that end are then not taken again (``_allowance``).
- ``settling``: Redis answers; the replica has re-registered what it holds (absolute counts, in
  the current epoch) and takes leases through Redis, still within that share, until connected for
  ``settle_s``, every replica known before has registered again (or ``lease_ttl_s`` passed) and
  none is stale. A ``shared`` replica that sees another's heartbeat go stale settles too.

A fault thus changes the mode twice, not once per dead connection (docs/architecture.md, "Shared
state through Redis"). Releases are batched for ``release_batch_s`` or ride on the next acquire
of the same team: Redis may count a lease a few milliseconds too long, never too short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import orjson
from redis.exceptions import RedisError

from backends.aio import cancel_and_wait
from gateway.state.redis_fields import RedisReplica
from gateway.state.redis_limits import listen

log = logging.getLogger("cachegate.state")


class RedisState(RedisReplica):
    """``MemoryState``'s interface (acquire, release, set_team, teams, status, on_*), served from Redis."""

    shared = True

    @property
    def degraded(self) -> bool:
        return self.phase != "shared"

    async def start(self) -> None:
        try:
            fresh = await self._join()
            self._prev_replicas = self.replicas
            self._since = time.monotonic()
            # An empty Redis: others may hold leases they have not registered yet.
            self._set_phase("settling" if fresh else "shared")
        except RedisError as exc:
            self._fault(exc)
        self.transitions = 0
        self._announce()
        self._tasks = [
            asyncio.create_task(self._beat_loop(), name="redis-heartbeat"),
            asyncio.create_task(
                listen(
                    self.redis,
                    self.events,
                    lambda team: self.on_wake(team),
                    self.limits,
                    self._fault,
                    min(0.25, self.heartbeat_s),
                ),
                name="redis-events",
            ),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        if self._flush is not None:
            self._flush.cancel()
        if self._spawned:
            await asyncio.gather(*self._spawned, return_exceptions=True)
        with contextlib.suppress(RedisError, OSError):
            teams = sorted(self._written | set(self.count))
            await self._leave(
                keys=[self._key("replicas"), *(self._key("lease", t) for t in teams)], args=[self.replica]
            )
        await self.redis.aclose()

    # ----- leases --------------------------------------------------------------------------------

    async def acquire(self, team: str, rid: str, limit: int) -> bool:
        """Take one of ``team``'s ``limit`` slots for ``rid``. False: wait (requeue) and try again."""
        if self.phase != "shared" and self.count.get(team, 0) + self._inflight.get(team, 0) >= self._allowance(
            team, limit
        ):
            self._refused[team] = time.monotonic()
            return False
        if self.phase == "unreachable":
            if self._registering:  # its counts are being written: take nothing meanwhile
                return False
        else:
            self._inflight[team] = self._inflight.get(team, 0) + 1
            self._ops += 1  # counted from now: a re-registration must not run before it is answered
            call = asyncio.ensure_future(self._call_acquire(team, limit, self._pending.pop(team, 0)))
            try:
                ok = await asyncio.shield(call)
            except asyncio.CancelledError:
                # The client left while the script ran: a lease it granted goes back with the next write.
                call.add_done_callback(lambda f: self._give_back(f, team))
                raise
            except RedisError as exc:
                self._fault(exc)
                self._wake_soon(team)  # decided again under this replica's share
                return False
            finally:
                self._inflight[team] -= 1
            if ok == -1:
                self._lost("Redis lost its state (restart or flush): re-registering this replica's leases")
                self._wake_soon(team)
                return False
            if ok != 1:
                self._refused[team] = time.monotonic()
                return False
        self.held[rid] = team
        self.count[team] = self.count.get(team, 0) + 1
        return True

    async def release(self, team: str, rid: str) -> None:
        if self.held.pop(rid, None) is None:
            return
        left = self.count.get(team, 1) - 1
        if left > 0:
            self.count[team] = left
        else:
            self.count.pop(team, None)
        if time.monotonic() - self._refused.get(team, -1e9) < 2 * self.heartbeat_s + 1:
            self._wake_soon(team)  # a request of this team waits here: try it now
        if self.phase == "unreachable" and not self._registering:
            return  # Redis gets this replica's absolute counts when it answers again
        self._defer_release(team)

    async def _call_acquire(self, team: str, limit: int, pending: int) -> int:
        # Only a shared-mode view of the old epoch counts everyone: a reply from another epoch or
        # while settling lacks the replicas not registered again and would hide their excess.
        view = self.phase == "shared"
        try:
            ok, flat = await self._acquire(
                keys=[self._key("lease", team), self._key("epoch"), self.events, self._key("leases")],
                args=[limit, self.replica, self.epoch or "", pending, orjson.dumps({"kind": "release", "team": team})],
            )
        finally:
            self._ops -= 1
        self._written.add(team)
        if view and int(ok) != -1:
            self._seen[team] = {
                flat[i].decode(): int(flat[i + 1])
                for i in range(0, len(flat), 2)
                if flat[i][:1] != b"~" and flat[i].decode() != self.replica
            }
        return int(ok)

    def _give_back(self, call: asyncio.Future[int], team: str) -> None:
        if not call.cancelled() and call.exception() is None and call.result() == 1:
            self._defer_release(team)

    def _defer_release(self, team: str) -> None:
        self._pending[team] = self._pending.get(team, 0) + 1
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush is None and self._pending:
            self._flush = asyncio.get_running_loop().call_later(self.release_batch_s, self._flush_now)

    def _flush_now(self) -> None:
        self._flush = None
        if self._pending and self.phase != "unreachable":
            batch, self._pending = self._pending, {}
            self._ops += 1
            self._spawn(self._write_releases(batch))

    async def _write_releases(self, batch: dict[str, int]) -> None:
        keys: list[str] = [self.events]
        args: list[str | int] = [self.replica]
        for team, n in batch.items():
            keys.append(self._key("lease", team))
            args += [n, orjson.dumps({"kind": "release", "team": team}).decode()]
        try:
            await self._release(keys=keys, args=args)
        except RedisError as exc:
            self._fault(exc)
        finally:
            self._ops -= 1

    def _allowance(self, team: str, limit: int) -> int:
        """How many leases of ``team`` this replica may hold while not ``shared``: what Redis counted
        for it at the fault, and (once the others must have noticed) its share of the limit less
        what the other replicas held beyond theirs when this replica last looked."""
        if limit <= 0:
            return 0
        floor = self._floor.get(team, 0)
        if self.phase == "unreachable" and time.monotonic() - self._last_beat < self.grace_s:
            return floor  # the others still trust what Redis counts for this replica
        # From now on another replica may take its share on a view older than this replica's
        # last leases beyond its own share: those that end are not taken again (issue #14).
        held = self.count.get(team, 0) + self._inflight.get(team, 0)
        if held < floor:
            self._floor[team] = floor = held
        cap = max(1, int(limit * self._share()))
        excess = sum(max(0, n - cap) for n in self._seen.get(team, {}).values())
        return max(floor, cap - excess)

    # ----- runtime team limits (gateway/state/redis_limits.py) ----------------------------------------

    async def set_team(self, team: str, fields: dict[str, Any]) -> None:
        """Store ``team``'s limits and tell every replica (raises when Redis is unreachable)."""
        await self.limits.set(team, fields)

    async def teams(self) -> dict[str, dict[str, Any]]:
        return await self.limits.all()

    def status(self) -> dict[str, Any]:
        return {
            "mode": "degraded" if self.degraded else "redis",
            "phase": self.phase,
            "replicas": self.replicas,
            "epoch": self.epoch,
            "leases": len(self.held),
            "transitions": self.transitions,
            "error": self.last_error or None,
        }

    # ----- membership, faults ---------------------------------------------------------------------

    async def _join(self) -> bool:
        """Register this replica and the leases it holds (absolute counts); True if Redis had lost
        its state (a new epoch), in which case the runtime limits known here are written back."""
        self._registering = True  # until the caller leaves "unreachable": no local grant Redis would miss
        try:
            self._pending.clear()  # absolute counts supersede releases not yet written
            if self._flush is not None:
                self._flush.cancel()
                self._flush = None
            counts = {t: self.count.get(t, 0) for t in sorted(self._written | set(self.count))}
            candidate = uuid.uuid4().hex[:16]
            epoch, live, fresh = await self._register(
                keys=[
                    self._key("replicas"),
                    self._key("epoch"),
                    self._key("leases"),
                    *(self._key("lease", t) for t in counts),
                ],
                args=[self.replica, candidate, self.lease_ttl_s, self.fresh_s, *counts.values()],
            )
            epoch = epoch.decode()
            self._written = {t for t, n in counts.items() if n}
            lost = epoch != self.epoch
            if lost and self.epoch is not None:
                log.warning(
                    "Redis lost its state (epoch %s -> %s): this replica re-registered %d lease(s)",
                    self.epoch,
                    epoch,
                    sum(counts.values()),
                )
            self.epoch = epoch
            self.replicas = max(1, int(live))
            self._stale = int(live) - int(fresh)
            self._last_beat = time.monotonic()
            await self.limits.sync(write_back=lost)
            return bool(epoch == candidate)
        finally:
            self._registering = False

    async def _beat(self) -> None:
        code, live, fresh = await self._heartbeat(
            keys=[self._key("replicas"), self._key("epoch"), self._key("leases")],
            args=[self.replica, self.epoch or "", self.lease_ttl_s, self.fresh_s],
        )
        if code < 0:
            self._lost(
                "Redis lost its state (restart or flush)"
                if code == -1
                else f"this replica missed its heartbeats for {self.lease_ttl_s} s and was dropped"
            )
            return
        self._last_beat = time.monotonic()
        live = max(1, int(live))
        self._stale = live - int(fresh)
        if live != self.replicas:
            self.replicas = live
            self._announce()
        now = time.monotonic()
        if self.phase == "shared" and self._stale > 0:
            self._prev_replicas = live
            self._since = now
            self._freeze()
            self._set_phase("settling")
            log.warning(
                "%d replica(s) stopped heartbeating: each replica keeps to its share of every team "
                "limit until they are back or dead (%.0f s)",
                self._stale,
                self.lease_ttl_s,
            )
            self._announce()
        elif (
            self.phase == "settling"
            and self._stale == 0
            and now - self._since >= self.settle_s
            and (live >= self._prev_replicas or now - self._since >= self.lease_ttl_s)
        ):
            self._set_phase("shared")
            self.last_error = ""
            log.warning("team limits are shared through Redis across %d replica(s) again", live)
            self._announce()

    async def _beat_loop(self) -> None:
        while True:
            delay = self.heartbeat_s if self.phase != "unreachable" else min(0.25, self.heartbeat_s)
            # asyncio.timeout: 3.11's wait_for swallows a cancel that meets a kick (stop() would hang)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()
            self._kick.clear()
            try:
                if self.phase == "unreachable":
                    if self._ops:  # calls from before the fault still in flight: let them end first
                        continue
                    await self._join()
                    self._since = time.monotonic()
                    self._set_phase("settling")
                    self._announce()
                    self._schedule_flush()  # releases made while registering
                    self._wake_refused()
                else:
                    await self._beat()
            except RedisError as exc:
                self._fault(exc)
                self._kick.clear()  # retry after the delay, not at once: Redis is down

    def _fault(self, exc: Exception) -> None:
        """A call failed: drop every pooled connection at once (they died together), enforce this
        replica's share locally, and reconnect from the heartbeat loop."""
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.phase != "unreachable":
            was = self.phase
            self._to_unreachable()
            log.error(
                "Redis unreachable (%s): DEGRADED MODE, this replica enforces 1/%d of every team limit "
                "locally until Redis is back (was %s)",
                self.last_error,
                self._prev_replicas,
                was,
            )
            self._spawn(self.redis.connection_pool.disconnect(inuse_connections=True))
            self._announce()
        self._kick.set()

    def _lost(self, reason: str) -> None:
        self.last_error = reason
        if self.phase != "unreachable":
            self._to_unreachable()
            log.error("%s: enforcing 1/%d of every team limit locally meanwhile", reason, self._prev_replicas)
            self._announce()
        self._kick.set()

    def _to_unreachable(self) -> None:
        if self.phase == "shared":
            self._prev_replicas = self.replicas
        self._freeze()
        self._set_phase("unreachable")
        wait = self.grace_s - (time.monotonic() - self._last_beat)
        if wait > 0:  # then each replica may use its share: try the requests refused meanwhile
            asyncio.get_running_loop().call_later(wait, self._wake_refused)

    def _freeze(self) -> None:
        """Leaving ``shared``: remember what Redis counts for this replica (held + releases not yet written)."""
        self._floor = {t: self.count.get(t, 0) + self._pending.get(t, 0) for t in {*self.count, *self._pending}}

    def _wake_refused(self) -> None:
        for team in list(self._refused):
            self.on_wake(team)

    def _set_phase(self, phase: str) -> None:
        if (phase == "shared") != (self.phase == "shared"):
            self.transitions += 1
        self.phase = phase

    def _share(self) -> float:
        if self.phase == "shared":
            return 1.0 / self.replicas
        return 1.0 / max(self._prev_replicas, self.replicas)

    def _announce(self) -> None:
        self.on_share(self._share(), self.degraded)

    def _wake_soon(self, team: str) -> None:
        asyncio.get_running_loop().call_soon(self.on_wake, team)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
