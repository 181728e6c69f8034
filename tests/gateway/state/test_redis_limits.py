"""Runtime team limits in Redis (gateway/state/redis_limits.py, ``RuntimeLimits``) and the events
listener (``listen``), on a real Redis under keys of this test's own: versions decide which change
wins, a loss is repaired by writing back what a replica knows, and events reach their callbacks.
Across replicas and Redis restarts: tests/gateway/test_redis_faults.py and test_shared_state.py."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.state.redis_limits import RuntimeLimits, listen
from tests.fake_upstream import free_port

pytestmark = pytest.mark.redis


class Seen:
    def __init__(self) -> None:
        self.limits: list[tuple[str, dict[str, Any]]] = []
        self.woken: list[str] = []
        self.errors: list[Exception] = []
        self.changed = asyncio.Event()

    def on_limits(self, team: str, fields: dict[str, Any]) -> None:
        self.limits.append((team, fields))
        self.changed.set()

    def on_wake(self, team: str) -> None:
        self.woken.append(team)
        self.changed.set()

    async def next(self) -> None:
        await asyncio.wait_for(self.changed.wait(), 2)
        self.changed.clear()


@pytest.fixture()
async def client(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    prefix = f"cgtest-{uuid.uuid4().hex[:8]}"
    redis = aioredis.Redis.from_url(redis_url)
    yield redis, prefix
    async for key in redis.scan_iter(match=f"{prefix}:*"):
        await redis.delete(key)
    await redis.aclose()


def entry(fields: dict[str, Any], version: int) -> bytes:
    return orjson.dumps({"fields": fields, "v": version})


async def test_set_stores_a_versioned_entry_tells_every_replica_and_applies_it_here(
    client: tuple[aioredis.Redis, str],
) -> None:
    redis, prefix = client
    seen = Seen()
    limits = RuntimeLimits(redis, f"{prefix}:teams", f"{prefix}:events", seen.on_limits)
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(f"{prefix}:events")
    await limits.set("a", {"max_concurrency": 4})
    stored = orjson.loads(await redis.hget(f"{prefix}:teams", "a"))
    assert stored["fields"] == {"max_concurrency": 4} and stored["v"] > 0
    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
    message = message or await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
    assert message is not None
    assert orjson.loads(message["data"]) == {
        "kind": "limits",
        "team": "a",
        "fields": {"max_concurrency": 4},
        "v": stored["v"],
    }
    assert seen.limits == [("a", {"max_concurrency": 4})] and limits.known["a"] == ({"max_concurrency": 4}, stored["v"])
    await pubsub.aclose()


async def test_all_reads_every_team_old_entries_included(client: tuple[aioredis.Redis, str]) -> None:
    redis, prefix = client
    await redis.hset(f"{prefix}:teams", mapping={"a": entry({"weight": 2}, 7), "legacy": orjson.dumps({"weight": 3})})
    limits = RuntimeLimits(redis, f"{prefix}:teams", f"{prefix}:events", Seen().on_limits)
    assert await limits.all() == {"a": {"weight": 2}, "legacy": {"weight": 3}}


def test_apply_takes_a_change_unless_a_newer_or_the_same_one_is_known() -> None:
    seen = Seen()
    limits = RuntimeLimits(aioredis.Redis(), "k", "e", seen.on_limits)  # no call reaches Redis here
    limits.apply("a", {"weight": 1}, 10)
    limits.apply("a", {"weight": 1}, 10)  # the same change again (own write, then its event)
    limits.apply("a", {"weight": 9}, 5)  # older
    limits.apply("a", {"weight": 2}, 10)  # same version, other fields: taken
    limits.apply("a", {"weight": 3}, 11)
    limits.apply("b", {"weight": 4}, 0)
    assert seen.limits == [("a", {"weight": 1}), ("a", {"weight": 2}), ("a", {"weight": 3}), ("b", {"weight": 4})]
    assert limits.known == {"a": ({"weight": 3}, 11), "b": ({"weight": 4}, 0)}


async def test_sync_writes_back_what_redis_lost_and_takes_what_is_newer(
    client: tuple[aioredis.Redis, str], caplog: pytest.LogCaptureFixture
) -> None:
    redis, prefix = client
    key = f"{prefix}:teams"
    seen = Seen()
    limits = RuntimeLimits(redis, key, f"{prefix}:events", seen.on_limits)
    limits.apply("a", {"weight": 1}, 10)
    limits.apply("b", {"weight": 1}, 10)
    await redis.hset(key, mapping={"b": entry({"weight": 5}, 20), "c": entry({"weight": 6}, 1)})  # another's newer
    seen.limits.clear()
    await limits.sync(write_back=False)
    assert not await redis.hexists(key, "a"), "no write-back unless asked"
    assert sorted(seen.limits) == [("b", {"weight": 5}), ("c", {"weight": 6})]
    await redis.delete(key)  # Redis emptied (restart without persistence, flush)
    await redis.hset(key, mapping={"c": entry({"weight": 7}, 30)})  # one replica wrote back already
    seen.limits.clear()
    with caplog.at_level(logging.WARNING, logger="cachegate.state"):
        await limits.sync(write_back=True)
    stored = {t.decode(): orjson.loads(v) for t, v in (await redis.hgetall(key)).items()}
    assert stored == {
        "a": {"fields": {"weight": 1}, "v": 10},
        "b": {"fields": {"weight": 5}, "v": 20},
        "c": {"fields": {"weight": 7}, "v": 30},
    }, "each team's newest version, wherever it was known"
    assert seen.limits == [("c", {"weight": 7})], "only what is new here is applied"
    assert "written back to Redis: a, b, c" in caplog.text


async def test_the_listener_wakes_teams_and_applies_limits(client: tuple[aioredis.Redis, str]) -> None:
    redis, prefix = client
    seen = Seen()
    limits = RuntimeLimits(redis, f"{prefix}:teams", f"{prefix}:events", seen.on_limits)
    task = asyncio.create_task(listen(redis, f"{prefix}:events", seen.on_wake, limits, seen.errors.append, 0.05))
    try:
        for _ in range(100):  # until subscribed
            if (await redis.pubsub_numsub(f"{prefix}:events"))[0][1]:
                break
            await asyncio.sleep(0.01)
        await redis.publish(f"{prefix}:events", orjson.dumps({"kind": "release", "team": "a"}))
        await seen.next()
        await redis.publish(
            f"{prefix}:events", orjson.dumps({"kind": "limits", "team": "b", "fields": {"weight": 2}, "v": 3})
        )
        await seen.next()
        await redis.publish(f"{prefix}:events", orjson.dumps({"kind": "something new", "team": "c"}))
        await redis.publish(f"{prefix}:events", orjson.dumps({"kind": "limits", "team": "b", "fields": {"weight": 1}}))
        await redis.publish(f"{prefix}:events", orjson.dumps({"kind": "release", "team": "d"}))
        await seen.next()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert seen.woken == ["a", "d"]
    assert seen.limits == [("b", {"weight": 2})], "an event without a version is older than any known"
    assert not seen.errors


async def test_a_broken_subscription_is_reported_and_tried_again() -> None:
    seen = Seen()
    dead = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    limits = RuntimeLimits(dead, "k", "e", seen.on_limits)
    task = asyncio.create_task(listen(dead, "e", seen.on_wake, limits, seen.errors.append, 0.05))
    await asyncio.sleep(0.18)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await dead.aclose()
    assert len(seen.errors) >= 2, "renewed after retry_s, reported each time"
    assert all(isinstance(e, RedisConnectionError) for e in seen.errors), seen.errors
