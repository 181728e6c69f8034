"""One replica's Redis connection, its scripts and its bookkeeping: the fields ``RedisState``
(gateway/state/redis_state.py) reads and changes as it moves between its phases."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.state import redis_scripts as lua
from gateway.state.redis_limits import RuntimeLimits


class RedisReplica:
    """Construction and field declarations of ``RedisState``; no behaviour beyond key names."""

    def __init__(
        self,
        url: str,
        prefix: str = "cachegate",
        lease_ttl_s: float = 10.0,
        heartbeat_s: float = 1.0,
        release_batch_s: float = 0.02,
        settle_s: float | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.lease_ttl_s = lease_ttl_s
        self.heartbeat_s = heartbeat_s
        self.release_batch_s = release_batch_s
        self.settle_s = 2 * heartbeat_s if settle_s is None else settle_s
        self.fresh_s = 2 * heartbeat_s  # a replica silent longer than this may be degraded
        self.grace_s = self.fresh_s + 1.5 * heartbeat_s  # by then every other replica has seen it
        self.replica = uuid.uuid4().hex[:12]
        # No automatic retry: a script is not replayed blindly; a fault is handled once, for the pool.
        # A blocking pool: a burst of requests waits (up to 1 s) for a pooled connection. redis-py's
        # default pool raises MaxConnectionsError past 100 calls at once, which read as a Redis fault
        # (degraded mode, the pool dropped under calls still connecting: 500s) when 1,000 streams a
        # second arrive (docs/benchmarks.md, "The relay at scale", its 5,000-stream line).
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=100,
            timeout=1.0,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
        )
        self.redis: aioredis.Redis = aioredis.Redis.from_pool(pool)
        self.phase = "unreachable"
        self.epoch: str | None = None
        self.last_error = ""
        self.replicas = 1
        self.transitions = 0  # changes between shared and degraded enforcement
        self.held: dict[str, str] = {}  # rid -> team
        self.count: dict[str, int] = {}  # team -> leases held here
        self.on_wake: Callable[[str], None] = lambda team: None
        self.on_limits: Callable[[str, dict[str, Any]], None] = lambda team, fields: None
        self.limits = RuntimeLimits(
            self.redis, self._key("teams"), self.events, lambda team, fields: self.on_limits(team, fields)
        )
        self.on_share: Callable[[float, bool], None] = lambda share, split: None
        self._prev_replicas = 1  # membership before the last fault
        self._last_beat = 0.0  # when the last heartbeat answered
        self._floor: dict[str, int] = {}  # team -> leases Redis counted for this replica at the fault
        self._since = 0.0  # when the current settling began
        self._pending: dict[str, int] = {}  # releases not yet written
        self._written: set[str] = set()  # teams whose lease hash may hold a count of ours
        self._ops = 0  # lease calls in flight
        self._registering = False
        self._refused: dict[str, float] = {}  # team -> when a request of it was last refused
        self._stale = 0  # replicas registered but not heard from within fresh_s
        self._inflight: dict[str, int] = {}  # team -> lease calls in flight
        self._seen: dict[str, dict[str, int]] = {}  # team -> other replicas' leases when last looked
        self._flush: asyncio.TimerHandle | None = None
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._spawned: set[asyncio.Task[Any]] = set()
        self._acquire = self.redis.register_script(lua.ACQUIRE)
        self._release = self.redis.register_script(lua.RELEASE)
        self._heartbeat = self.redis.register_script(lua.HEARTBEAT)
        self._register = self.redis.register_script(lua.REGISTER)
        self._leave = self.redis.register_script(lua.LEAVE)

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @property
    def events(self) -> str:
        return self._key("events")
