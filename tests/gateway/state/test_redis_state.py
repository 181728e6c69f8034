"""Team leases, live replicas and runtime limits through Redis (gateway/state/redis_state.py,
``RedisState``) on a real Redis, keys under a prefix of each test's own and heartbeats of 50 ms: the
phases from joining to ``shared``, leases granted and refused across two replicas, releases batched
and waking a waiting replica, the share announced, leaving, a Redis that lost its state, and local
grants while Redis is unreachable. The same through restarts, flushes and outages of a private Redis
(peaks counted against the limit): tests/gateway/test_redis_faults.py."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis

from gateway.state.redis_scripts import live_leases
from gateway.state.redis_state import RedisState
from tests.fake_upstream import free_port

pytestmark = pytest.mark.redis

HEARTBEAT_S = 0.05


class Watched(RedisState):
    """A ``RedisState`` whose callbacks are recorded (as the Gateway sets them)."""

    def __init__(self, url: str, prefix: str, **kw: Any) -> None:
        super().__init__(url, prefix=prefix, lease_ttl_s=1.0, heartbeat_s=HEARTBEAT_S, **kw)
        self.woken: list[str] = []
        self.shares: list[tuple[float, bool]] = []
        self.limits_seen: list[tuple[str, dict[str, Any]]] = []
        self.on_wake = self.woken.append
        self.on_share = lambda share, split: self.shares.append((share, split))
        self.on_limits = lambda team, fields: self.limits_seen.append((team, fields))


async def until(check: Callable[[], object], timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time given"
        await asyncio.sleep(0.01)


@pytest.fixture()
def prefix(redis_url: str) -> Any:
    name = f"cgtest-{uuid.uuid4().hex[:8]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"{name}:*"):
        client.delete(key)
    client.close()


async def stopped(state: RedisState) -> None:
    """``state.stop()``, within 5 s (a heartbeat loop that swallowed its cancellation would hang it)."""
    async with asyncio.timeout(5):
        await state.stop()


@asynccontextmanager
async def replica(url: str, prefix: str) -> AsyncIterator[Watched]:
    state = Watched(url, prefix)
    await state.start()
    try:
        yield state
    finally:
        await stopped(state)


async def test_the_first_replica_settles_then_shares(redis_url: str, prefix: str) -> None:
    async with replica(redis_url, prefix) as a:
        assert a.phase == "settling" and a.degraded, "an empty Redis: others may hold leases not registered yet"
        assert a.status()["mode"] == "degraded" and a.epoch is not None
        await until(lambda: a.phase == "shared")
        status = a.status()
        assert (status["mode"], status["phase"], status["replicas"], status["error"]) == ("redis", "shared", 1, None)
        assert status["transitions"] == 1 and a.shares[0] == (1.0, True) and a.shares[-1] == (1.0, False)


async def test_leases_are_shared_by_two_replicas_and_a_release_wakes_the_waiting_one(
    redis_url: str, prefix: str
) -> None:
    async with replica(redis_url, prefix) as a, replica(redis_url, prefix) as b:
        await until(lambda: a.phase == b.phase == "shared" and a.replicas == b.replicas == 2)
        assert a.shares[-1] == (0.5, False) and b.shares[-1] == (0.5, False), "each its half of what is not a lease"
        assert await a.acquire("t", "r1", 3) and await a.acquire("t", "r2", 3) and await b.acquire("t", "r3", 3)
        assert not await b.acquire("t", "r4", 3), "the team's limit holds across replicas"
        assert live_leases(redis_url, prefix) == {"t": 3}
        assert (a.status()["leases"], b.status()["leases"]) == (2, 1)
        await a.release("t", "r1")
        await until(lambda: "t" in b.woken)  # the refused replica hears of the free slot
        assert live_leases(redis_url, prefix) == {"t": 2}, "the batched release was written"
        assert await b.acquire("t", "r4", 3)
        await a.release("t", "unknown-rid")  # never held: nothing changes
        assert live_leases(redis_url, prefix) == {"t": 3}
    assert live_leases(redis_url, prefix) == {}, "replicas that stop give everything back"


async def test_a_release_rides_on_the_next_acquire_of_the_team(redis_url: str, prefix: str) -> None:
    async with replica(redis_url, prefix) as a:
        await until(lambda: a.phase == "shared")
        a.release_batch_s = 10.0  # the batch would be written late: the acquire carries the release
        assert await a.acquire("t", "r1", 1)
        await a.release("t", "r1")
        assert live_leases(redis_url, prefix) == {"t": 1}, "not written yet: counted a little too long, never short"
        assert await a.acquire("t", "r2", 1), "limit 1: granted only because the release came with it"
        assert live_leases(redis_url, prefix) == {"t": 1}


async def test_runtime_limits_are_stored_and_reach_every_replica(redis_url: str, prefix: str) -> None:
    async with replica(redis_url, prefix) as a, replica(redis_url, prefix) as b:
        await a.set_team("t", {"max_concurrency": 5})
        await until(lambda: b.limits_seen == [("t", {"max_concurrency": 5})])
        assert a.limits_seen == [("t", {"max_concurrency": 5})], "applied once where it was set"
        assert await b.teams() == {"t": {"max_concurrency": 5}}


async def test_a_redis_that_lost_its_state_gets_the_leases_back_from_their_replica(redis_url: str, prefix: str) -> None:
    async with replica(redis_url, prefix) as a:
        await until(lambda: a.phase == "shared")
        assert await a.acquire("t", "r1", 5) and await a.acquire("t", "r2", 5)
        await a.set_team("t", {"weight": 3})
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}:*"):  # a flush (or a restart without persistence)
            client.delete(key)
        client.close()
        assert not await a.acquire("t", "r3", 5), "another epoch: no lease taken in a Redis that lost its state"
        assert a.phase != "shared"
        await until(lambda: a.phase == "shared")
        assert live_leases(redis_url, prefix) == {"t": 2}, "re-registered: absolute counts"
        assert await a.teams() == {"t": {"weight": 3}}, "runtime limits written back"
        assert a.status()["transitions"] >= 3


async def test_without_redis_a_replica_grants_locally_within_its_share() -> None:
    lonely = Watched(f"redis://127.0.0.1:{free_port()}/0", "cgtest-none")
    await lonely.start()

    async def acquire(team: str, rid: str, limit: int) -> bool:
        # While a reconnection attempt writes its counts (every 50 ms here) a replica takes nothing: decide
        # between attempts (an acquire without Redis does not wait, so nothing starts meanwhile).
        await until(lambda: not lonely._registering)
        return await lonely.acquire(team, rid, limit)

    try:
        status = lonely.status()
        assert (status["mode"], status["phase"]) == ("degraded", "unreachable")
        assert "ConnectionError" in status["error"] and lonely.shares[-1] == (1.0, True)
        assert await acquire("t", "r1", 2) and await acquire("t", "r2", 2)
        assert not await acquire("t", "r3", 2), "its share of the limit (alone: all of it), no more"
        assert not await acquire("u", "r4", 0)
        await lonely.release("t", "r1")
        assert await acquire("t", "r3", 2)
        assert lonely.status()["leases"] == 2
        with pytest.raises(redis.RedisError):
            await lonely.set_team("t", {"weight": 1})
    finally:
        await stopped(lonely)


async def test_stop_ends_the_heartbeat_even_when_it_was_just_kicked(redis_url: str, prefix: str) -> None:
    state = RedisState(redis_url, prefix=prefix, heartbeat_s=5.0)
    await state.start()
    await asyncio.sleep(0.02)  # the heartbeat loop waits for its next beat or a kick
    state._kick.set()  # what _fault and _lost do, here from the task that then stops the replica
    stopping = asyncio.ensure_future(state.stop())
    done, _ = await asyncio.wait([stopping], timeout=0.3)
    if not done:  # the loop swallowed the cancellation: cancel it again so the test can end
        state._tasks[0].cancel()
        await stopping
    assert done, "stop() did not return: the heartbeat swallowed its cancellation"
