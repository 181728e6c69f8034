"""State that replicas must agree on, shared through Redis (interfaces §2, §5).

- **Team leases**: a dispatched request holds a lease in its team's sorted set (member: request id,
  score: expiry by Redis's clock). Taking one is an atomic Lua script that drops expired leases and
  counts; leases are renewed while held, so a replica that dies gives its leases back within
  ``lease_ttl_s``. A refused lease goes back to the core as ``requeue``; a release publishes an
  event that wakes the waiters of that team on every replica (no polling).
- **Live replicas**: each replica heartbeats into a sorted set; ``1 / live replicas`` is this
  replica's share of every limit that is not a lease (seat budget per backend, queue bound, token
  rate), so two replicas never overfill one engine between them.
- **Runtime team limits**: a hash written by the admin API; a change is published and applied by
  every replica, and read back at start, so it survives restarts.
- **Degraded mode**: when Redis is unreachable the replica keeps serving, enforcing its share of
  every limit (concurrency included) locally, says so (log, ``cachegate_redis_degraded``,
  ``/readyz`` detail), and returns to shared enforcement when Redis answers again. Leases held
  meanwhile are written back, so no count is lost and nothing stays locked: every lease expires.

Without a Redis URL, ``MemoryState`` serves the same interface for one process: the core's own
counters are then exact and every lease is granted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.aio import cancel_and_wait

log = logging.getLogger("cachegate.state")

_ACQUIRE = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], t + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2]) * 1000) + 1000)
  return 1
end
return 0
"""

_RENEW = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], t + tonumber(ARGV[1]), ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], math.ceil(tonumber(ARGV[1]) * 1000) + 1000)
end
return #KEYS
"""

_HEARTBEAT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t)
redis.call('ZADD', KEYS[1], t + tonumber(ARGV[1]), ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""


class MemoryState:
    """One process, no Redis: leases always granted (the core's counters are exact), share 1."""

    degraded = False
    replicas = 1
    shared = False

    def __init__(self) -> None:
        self.on_wake: Callable[[str], None] = lambda team: None
        self.on_limits: Callable[[str, dict[str, Any]], None] = lambda team, fields: None
        self.on_share: Callable[[float, bool], None] = lambda share, split: None
        self._teams: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def acquire(self, team: str, rid: str, limit: int) -> bool:
        return True

    async def release(self, team: str, rid: str) -> None:
        return None

    async def set_team(self, team: str, fields: dict[str, Any]) -> None:
        self._teams[team] = fields
        self.on_limits(team, fields)

    async def teams(self) -> dict[str, dict[str, Any]]:
        return dict(self._teams)

    def status(self) -> dict[str, Any]:
        return {"mode": "memory", "replicas": 1}


class RedisState:
    def __init__(self, url: str, prefix: str = "cachegate", lease_ttl_s: float = 10.0,
                 heartbeat_s: float = 1.0) -> None:
        self.url = url
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_s = heartbeat_s
        self.replica = uuid.uuid4().hex[:12]
        self.redis: aioredis.Redis = aioredis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                                       health_check_interval=10)
        self.degraded = False
        self.last_error = ""
        self.replicas = 1
        self.shared = True
        self.held: dict[str, str] = {}  # rid -> team
        self.on_wake: Callable[[str], None] = lambda team: None
        self.on_limits: Callable[[str, dict[str, Any]], None] = lambda team, fields: None
        self.on_share: Callable[[float, bool], None] = lambda share, split: None
        self._tasks: list[asyncio.Task[None]] = []
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._renew = self.redis.register_script(_RENEW)
        self._heartbeat = self.redis.register_script(_HEARTBEAT)

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @property
    def events(self) -> str:
        return self._key("events")

    async def start(self) -> None:
        try:
            await self._beat()
            for team, fields in (await self.teams()).items():
                self.on_limits(team, fields)
        except RedisError as exc:
            self._degrade(exc)
        self._announce()
        self._tasks = [asyncio.create_task(self._beat_loop(), name="redis-heartbeat"),
                       asyncio.create_task(self._listen(), name="redis-events")]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        with contextlib.suppress(RedisError):
            await self.redis.zrem(self._key("replicas"), self.replica)
            for rid, team in list(self.held.items()):
                await self.redis.zrem(self._key("lease", team), rid)
        await self.redis.aclose()

    # ----- leases --------------------------------------------------------------------------------

    async def acquire(self, team: str, rid: str, limit: int) -> bool:
        """Take one of ``team``'s ``limit`` leases for ``rid``; in degraded mode the core's split cap holds."""
        if not self.degraded:
            try:
                ok = bool(await self._acquire(keys=[self._key("lease", team)], args=[limit, self.lease_ttl_s, rid]))
            except RedisError as exc:
                self._degrade(exc)
                ok = True
            if not ok:
                return False
        self.held[rid] = team
        return True

    async def release(self, team: str, rid: str) -> None:
        if self.held.pop(rid, None) is None:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(self._key("lease", team), rid)
                pipe.publish(self.events, orjson.dumps({"kind": "release", "team": team}))
                await pipe.execute()
        except RedisError as exc:
            self._degrade(exc)

    # ----- runtime team limits -------------------------------------------------------------------

    async def set_team(self, team: str, fields: dict[str, Any]) -> None:
        """Store ``team``'s limits and tell every replica (raises when Redis is unreachable)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self._key("teams"), team, orjson.dumps(fields))
            pipe.publish(self.events, orjson.dumps({"kind": "limits", "team": team, "fields": fields}))
            await pipe.execute()
        self.on_limits(team, fields)

    async def teams(self) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self._key("teams"))
        return {k.decode() if isinstance(k, bytes) else k: orjson.loads(v) for k, v in raw.items()}

    def status(self) -> dict[str, Any]:
        return {"mode": "degraded" if self.degraded else "redis", "replicas": self.replicas,
                "error": self.last_error or None}

    # ----- background ----------------------------------------------------------------------------

    async def _beat(self) -> None:
        count = int(await self._heartbeat(keys=[self._key("replicas")], args=[3 * self.heartbeat_s + 1, self.replica]))
        if self.held:
            rids = list(self.held)
            await self._renew(keys=[self._key("lease", self.held[r]) for r in rids], args=[self.lease_ttl_s, *rids])
        if count != self.replicas:
            self.replicas = max(1, count)
            self._announce()

    async def _beat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._beat()
                if self.degraded:
                    self.degraded = False
                    self.last_error = ""
                    log.warning("Redis is reachable again: team limits are shared across %d replica(s) again",
                                self.replicas)
                    self._announce()
            except RedisError as exc:
                self._degrade(exc)

    async def _listen(self) -> None:
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.events)
                async for message in pubsub.listen():
                    event = orjson.loads(message["data"])
                    if event.get("kind") == "release":
                        self.on_wake(str(event["team"]))
                    elif event.get("kind") == "limits":
                        self.on_limits(str(event["team"]), dict(event["fields"]))
            except (RedisError, OSError) as exc:
                self._degrade(exc)
                await asyncio.sleep(self.heartbeat_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _degrade(self, exc: Exception) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        if not self.degraded:
            self.degraded = True
            log.error("Redis unreachable (%s): DEGRADED MODE, each replica enforces 1/%d of every team limit "
                      "locally until Redis is back", self.last_error, self.replicas)
            self._announce()

    def _announce(self) -> None:
        self.on_share(1.0 / self.replicas, self.degraded)
