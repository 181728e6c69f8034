"""Runtime team limits (the admin API's changes) in Redis, versioned, and written back after a loss;
and the listener of the events channel (limits changed, a slot was released while someone waits).

Each replica keeps the limits it knows (read at start, received over pub/sub, set through its own
admin API) with their version (``time.time_ns()`` of the change). When it finds Redis emptied (a
restart without persistence, a flush), it writes them back; the newer version of a team wins, so
replicas that knew different changes converge on the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.state import redis_scripts as lua

log = logging.getLogger("cachegate.state")


class RuntimeLimits:
    def __init__(
        self, redis: aioredis.Redis, key: str, events: str, on_limits: Callable[[str, dict[str, Any]], None]
    ) -> None:
        self.redis = redis
        self.key = key
        self.events = events
        self.on_limits = on_limits
        self.known: dict[str, tuple[dict[str, Any], int]] = {}  # team -> (fields, version)
        self._merge = redis.register_script(lua.MERGE_LIMITS)

    async def set(self, team: str, fields: dict[str, Any]) -> None:
        """Store ``team``'s limits and tell every replica (raises when Redis is unreachable)."""
        version = time.time_ns()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.key, team, orjson.dumps({"fields": fields, "v": version}))
            pipe.publish(self.events, orjson.dumps({"kind": "limits", "team": team, "fields": fields, "v": version}))
            await pipe.execute()
        self.apply(team, fields, version)

    async def all(self) -> dict[str, dict[str, Any]]:
        raw = await self.redis.hgetall(self.key)
        return {lua.text(k): lua.decode_limits(v)[0] for k, v in raw.items()}

    def apply(self, team: str, fields: dict[str, Any], version: int) -> None:
        """A change seen (event, read, own): applied unless an equal or newer one is known."""
        known = self.known.get(team)
        if known is not None and (known[1] > version or known == (fields, version)):
            return
        self.known[team] = (fields, version)
        self.on_limits(team, fields)

    async def sync(self, write_back: bool) -> None:
        """After a loss, write back the limits known here (the newer version wins), then take any
        newer ones another replica wrote."""
        if write_back and self.known:
            pairs: list[str] = []
            for team, (fields, version) in self.known.items():
                pairs += [team, orjson.dumps({"fields": fields, "v": version}).decode()]
            if await self._merge(keys=[self.key], args=pairs):
                log.warning("runtime team limits written back to Redis: %s", ", ".join(sorted(self.known)))
        for name, raw in (await self.redis.hgetall(self.key)).items():
            fields, version = lua.decode_limits(raw)
            self.apply(lua.text(name), fields, version)


async def listen(
    redis: aioredis.Redis,
    channel: str,
    on_wake: Callable[[str], None],
    limits: RuntimeLimits,
    on_error: Callable[[Exception], None],
    retry_s: float,
) -> None:
    """Apply the events of ``channel`` until cancelled; a broken subscription is reported and renewed."""
    while True:
        pubsub = redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            async for message in pubsub.listen():
                event = orjson.loads(message["data"])
                if event.get("kind") == "release":
                    on_wake(str(event["team"]))
                elif event.get("kind") == "limits":
                    limits.apply(str(event["team"]), dict(event["fields"]), int(event.get("v", 0)))
        except (RedisError, OSError) as exc:
            on_error(exc)
            await asyncio.sleep(retry_s)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
