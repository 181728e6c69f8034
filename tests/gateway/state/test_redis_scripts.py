"""The Redis side of shared state (gateway/state/redis_scripts.py): each Lua script run on a real Redis
against the keys it is given (a prefix of this test's own), the decoding helpers, and ``live_leases``.
How ``RedisState`` drives the scripts: test_redis_state.py; through faults: tests/gateway/test_redis_faults.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from gateway.state import redis_scripts as lua

pytestmark = pytest.mark.redis

EPOCH = "epoch-1"


class Keys:
    """One test's keys, under a prefix no other test uses."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.prefix = f"cgtest-{uuid.uuid4().hex[:8]}"

    def __call__(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def script(self, source: str) -> Any:
        return self.client.register_script(source)


@pytest.fixture()
def keys(redis_url: str) -> Iterator[Keys]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    k = Keys(client)
    yield k
    for key in client.scan_iter(match=f"{k.prefix}:*"):
        client.delete(key)
    client.close()


def next_message(pubsub: Any, timeout: float) -> Any:
    """The next published message within ``timeout`` (the subscription's confirmation skipped), or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=max(0.0, deadline - time.monotonic()))
        if message is not None:
            return message
    return None


def _now(client: redis.Redis) -> float:
    sec, usec = client.time()
    return float(sec) + usec / 1e6


def acquire(k: Keys, replica: str, limit: int, pending: int = 0, epoch: str = EPOCH) -> tuple[int, dict[str, str]]:
    ok, flat = k.script(lua.ACQUIRE)(
        keys=[k("lease", "a"), k("epoch"), k("events"), k("leases")],
        args=[limit, replica, epoch, pending, '{"kind": "release", "team": "a"}'],
    )
    return int(ok), dict(zip(flat[::2], flat[1::2], strict=True))


def test_acquire_grants_up_to_the_limit_across_replicas_then_marks_a_waiter(keys: Keys) -> None:
    keys.client.set(keys("epoch"), EPOCH)
    assert acquire(keys, "r1", 3) == (1, {})
    assert keys.client.hgetall(keys("lease", "a")) == {"~e": EPOCH, "r1": "1"}
    assert keys.client.smembers(keys("leases")) == {keys("lease", "a")}, "indexed for the dead-replica sweep"
    assert acquire(keys, "r2", 3)[0] == 1
    ok, seen = acquire(keys, "r1", 3)
    assert ok == 1 and seen == {"~e": EPOCH, "r1": "1", "r2": "1"}, "the hash as read, before this grant"
    ok, seen = acquire(keys, "r2", 3)
    assert ok == 0 and seen == {"~e": EPOCH, "r1": "2", "r2": "1"}
    assert keys.client.hgetall(keys("lease", "a")) == {"~e": EPOCH, "r1": "2", "r2": "1", "~w": "1"}


def test_acquire_applies_releases_not_yet_written_and_wakes_a_waiter(keys: Keys) -> None:
    keys.client.set(keys("epoch"), EPOCH)
    keys.client.hset(keys("lease", "a"), mapping={"~e": EPOCH, "r1": 2, "~w": 1})
    pubsub = keys.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys("events"))
    assert acquire(keys, "r1", 2, pending=1)[0] == 1, "one release rides on the acquire: 2 - 1 < 2"
    assert keys.client.hgetall(keys("lease", "a")) == {"~e": EPOCH, "r1": "2", "~w": "1"}, "net 0: unchanged"
    assert acquire(keys, "r1", 2, pending=2)[0] == 1
    assert keys.client.hgetall(keys("lease", "a")) == {"~e": EPOCH, "r1": "1"}, "net -1: the waiter's mark cleared"
    message = next_message(pubsub, 1.0)
    assert message is not None and orjson.loads(message["data"]) == {"kind": "release", "team": "a"}
    assert acquire(keys, "r1", 1, pending=1)[0] == 1 and acquire(keys, "r1", 1, pending=1)[0] == 1
    pubsub.close()


def test_acquire_refuses_a_replica_of_another_epoch(keys: Keys) -> None:
    assert acquire(keys, "r1", 5)[0] == -1, "no epoch in Redis: it lost its state"
    assert not keys.client.exists(keys("lease", "a")), "nothing written"
    keys.client.set(keys("epoch"), "epoch-2")
    assert acquire(keys, "r1", 5)[0] == -1
    keys.client.hset(keys("lease", "a"), mapping={"~e": "epoch-2", "r2": 1})
    ok, seen = acquire(keys, "r1", 5)
    assert ok == -1 and seen == {"~e": "epoch-2", "r2": "1"}
    assert acquire(keys, "r1", 5, epoch="epoch-2")[0] == 1


def test_release_writes_a_batch_and_publishes_only_where_someone_waits(keys: Keys) -> None:
    keys.client.hset(keys("lease", "a"), mapping={"~e": EPOCH, "r1": 3, "~w": 1})
    keys.client.hset(keys("lease", "b"), mapping={"~e": EPOCH, "r1": 1, "r2": 4})
    pubsub = keys.client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys("events"))
    keys.script(lua.RELEASE)(
        keys=[keys("events"), keys("lease", "a"), keys("lease", "b")], args=["r1", 2, "wake-a", 1, "wake-b"]
    )
    assert keys.client.hgetall(keys("lease", "a")) == {"~e": EPOCH, "r1": "1"}
    assert keys.client.hgetall(keys("lease", "b")) == {"~e": EPOCH, "r2": "4"}, "a count at zero: its field goes"
    assert next_message(pubsub, 1.0)["data"] == "wake-a"
    assert next_message(pubsub, 0.1) is None, "team b: nobody waited"
    pubsub.close()


def heartbeat(k: Keys, replica: str, ttl: float = 10.0, fresh: float = 2.0, epoch: str = EPOCH) -> list[int]:
    return [
        int(x)
        for x in k.script(lua.HEARTBEAT)(
            keys=[k("replicas"), k("epoch"), k("leases")], args=[replica, epoch, ttl, fresh]
        )
    ]


def test_a_heartbeat_renews_and_drops_the_dead_with_their_leases(keys: Keys) -> None:
    c, now = keys.client, _now(keys.client)
    c.set(keys("epoch"), EPOCH)
    c.zadd(keys("replicas"), {"r1": now - 1, "stale": now - 5, "dead": now - 60})
    for team in ("a", "b"):
        c.hset(keys("lease", team), mapping={"~e": EPOCH, "r1": 1, "dead": 2, "stale": 1})
        c.sadd(keys("leases"), keys("lease", team))
    assert heartbeat(keys, "r1") == [1, 2, 1], "live: r1 and stale; fresh (heard within 2 s): r1"
    assert c.zrange(keys("replicas"), 0, -1) == ["stale", "r1"]
    assert c.zscore(keys("replicas"), "r1") >= now  # type: ignore[operator]
    for team in ("a", "b"):
        assert c.hgetall(keys("lease", team)) == {"~e": EPOCH, "r1": "1", "stale": "1"}
    assert heartbeat(keys, "dead")[0] == -2, "dropped: its leases are gone, it must register again"
    assert heartbeat(keys, "r1", epoch="other")[0] == -1, "Redis lost its state (or another epoch)"
    assert c.zcard(keys("replicas")) == 2, "neither answer registered anyone"


def test_register_writes_absolute_counts_and_keeps_an_existing_epoch(keys: Keys) -> None:
    c = keys.client
    c.hset(keys("lease", "b"), mapping={"r1": 5, "r2": 1})
    script = keys.script(lua.REGISTER)

    def register(candidate: str, counts: dict[str, int]) -> list[Any]:
        return list(
            script(
                keys=[keys("replicas"), keys("epoch"), keys("leases"), *(keys("lease", t) for t in counts)],
                args=["r1", candidate, 10.0, 2.0, *counts.values()],
            )
        )

    assert register("fresh-epoch", {"a": 2, "b": 0}) == ["fresh-epoch", 1, 1], "an empty Redis takes the candidate"
    assert c.get(keys("epoch")) == "fresh-epoch"
    assert c.hgetall(keys("lease", "a")) == {"r1": "2", "~e": "fresh-epoch"}
    assert c.hgetall(keys("lease", "b")) == {"r2": "1"}, "a zero count removes the field"
    assert c.smembers(keys("leases")) == {keys("lease", "a")}
    assert register("another", {"a": 1})[0] == "fresh-epoch", "an epoch already there stays"
    assert c.hget(keys("lease", "a"), "r1") == "1", "absolute, not added"


def test_merge_keeps_the_newer_version_of_each_team(keys: Keys) -> None:
    c = keys.client
    c.hset(keys("teams"), mapping={"a": orjson.dumps({"fields": {"max_concurrency": 1}, "v": 5}).decode()})
    c.hset(keys("teams"), mapping={"old": orjson.dumps({"max_concurrency": 9}).decode()})  # before versions
    pairs = {
        "a": {"fields": {"max_concurrency": 2}, "v": 4},  # older: kept out
        "old": {"fields": {"max_concurrency": 3}, "v": 1},
        "new": {"fields": {"max_concurrency": 4}, "v": 1},
    }
    args = [x for team, entry in pairs.items() for x in (team, orjson.dumps(entry).decode())]
    assert keys.script(lua.MERGE_LIMITS)(keys=[keys("teams")], args=args) == 2
    stored = {t: lua.decode_limits(raw) for t, raw in c.hgetall(keys("teams")).items()}
    assert stored == {
        "a": ({"max_concurrency": 1}, 5),
        "old": ({"max_concurrency": 3}, 1),
        "new": ({"max_concurrency": 4}, 1),
    }


def test_leave_gives_everything_back(keys: Keys) -> None:
    c = keys.client
    c.zadd(keys("replicas"), {"r1": 1.0, "r2": 1.0})
    c.hset(keys("lease", "a"), mapping={"~e": EPOCH, "r1": 2, "r2": 1})
    keys.script(lua.LEAVE)(keys=[keys("replicas"), keys("lease", "a")], args=["r1"])
    assert c.zrange(keys("replicas"), 0, -1) == ["r2"]
    assert c.hgetall(keys("lease", "a")) == {"~e": EPOCH, "r2": "1"}


def test_text_and_decode_limits() -> None:
    assert lua.text(b"caf\xc3\xa9") == "café" and lua.text("x") == "x"
    assert lua.decode_limits(b'{"fields": {"weight": 2}, "v": 17}') == ({"weight": 2}, 17)
    assert lua.decode_limits('{"weight": 2}') == ({"weight": 2}, 0), "written before versions"
    assert lua.decode_limits('{"fields": 1}') == ({"fields": 1}, 0), "not a versioned entry without both keys"


def test_live_leases_counts_only_live_replicas(keys: Keys, redis_url: str) -> None:
    c, now = keys.client, _now(keys.client)
    c.zadd(keys("replicas"), {"r1": now, "r2": now - 2, "dead": now - 60})
    c.hset(keys("lease", "a"), mapping={"~e": EPOCH, "~w": 1, "r1": 2, "r2": 1, "dead": 5})
    c.hset(keys("lease", "b"), mapping={"~e": EPOCH, "dead": 3})
    c.hset(keys("lease", "team:with:colons"), mapping={"r2": 1})
    assert lua.live_leases(redis_url, prefix=keys.prefix, ttl_s=10.0) == {"a": 3, "team:with:colons": 1}
    assert lua.live_leases(redis_url, prefix=keys.prefix, ttl_s=1.0) == {"a": 2}
    assert lua.live_leases(redis_url, prefix=keys.prefix + "-none") == {}
