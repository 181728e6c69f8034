"""One replica's Redis connection and bookkeeping (gateway/state/redis_fields.py, ``RedisReplica``): the
timings derived from the heartbeat, the key names, the callbacks reached however late they are set,
and the blocking pool: a burst of calls past its 100 connections waits for one instead of failing as
if Redis had. How ``RedisState`` uses these fields: test_redis_state.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.state.redis_fields import RedisReplica
from tests.fake_upstream import free_port


async def test_timings_follow_the_heartbeat() -> None:
    replica = RedisReplica("redis://127.0.0.1:1/0", heartbeat_s=0.5)
    assert (replica.settle_s, replica.fresh_s, replica.grace_s) == (1.0, 1.0, 1.75)
    assert RedisReplica("redis://127.0.0.1:1/0", heartbeat_s=0.5, settle_s=0).settle_s == 0, "0 is a setting"
    await replica.redis.aclose()


async def test_keys_replica_id_and_the_state_before_joining() -> None:
    a, b = RedisReplica("redis://127.0.0.1:1/0", prefix="p"), RedisReplica("redis://127.0.0.1:1/0")
    assert a._key("lease", "team") == "p:lease:team" and a.events == "p:events" and b.events == "cachegate:events"
    assert (a.limits.key, a.limits.events) == ("p:teams", "p:events")
    assert len(a.replica) == 12 and int(a.replica, 16) >= 0 and a.replica != b.replica
    assert (a.phase, a.epoch, a.replicas, a.transitions, a.held, a.count) == ("unreachable", None, 1, 0, {}, {})
    await a.redis.aclose()
    await b.redis.aclose()


async def test_limits_changes_reach_the_callback_set_after_construction() -> None:
    replica = RedisReplica("redis://127.0.0.1:1/0")
    seen: list[tuple[str, dict[str, Any]]] = []
    replica.limits.apply("a", {"weight": 1}, 1)  # the default callback: nothing happens
    replica.on_limits = lambda team, fields: seen.append((team, fields))  # set by the Gateway after construction
    replica.limits.apply("a", {"weight": 2}, 2)
    assert seen == [("a", {"weight": 2})]
    await replica.redis.aclose()


async def test_a_redis_that_is_not_there_fails_a_call_at_once() -> None:
    replica = RedisReplica(f"redis://127.0.0.1:{free_port()}/0")
    t0 = time.monotonic()
    with pytest.raises(RedisConnectionError):
        await replica.redis.ping()
    assert time.monotonic() - t0 < 0.5, "no retries: the fault is handled once, for the pool"
    await replica.redis.aclose()


@pytest.mark.redis
async def test_a_burst_past_the_pool_waits_for_a_connection(redis_url: str) -> None:
    replica = RedisReplica(redis_url)
    empty = f"cgtest-{uuid.uuid4().hex[:8]}:nothing"
    t0 = time.monotonic()
    # 150 calls at once, each holding its connection 0.1 s: 100 run, 50 wait for one to come back
    results = await asyncio.gather(*(replica.redis.blpop([empty], timeout=0.1) for _ in range(150)))
    took = time.monotonic() - t0
    assert results == [None] * 150, "none failed"
    assert 0.2 <= took < 1.5, f"{took:.2f} s: two rounds of 0.1 s at least, the second waiting for pooled connections"
    # (redis-py's default pool raises MaxConnectionsError, "Too many connections", on the 101st call at once)
    await replica.redis.aclose()
