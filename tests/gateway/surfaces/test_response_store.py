"""The response store (gateway/surfaces/response_store.py): in memory (LRU, bytes, TTL) and in real Redis shared
by two replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.surfaces.response_store import MemoryResponseStore, RedisResponseStore, StoredResponse


def record(
    rid: str = "resp_1", team: str | None = "red", status: str = "completed", text: str = "hi"
) -> StoredResponse:
    output = [
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]
    return StoredResponse(
        rid,
        team,
        "kimi",
        status,
        1700000000.0,
        input_items=[{"type": "message", "role": "user", "content": "q"}],
        response={"id": rid, "object": "response", "status": status, "output": output},
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_memory_store_round_trip_and_team_isolation() -> None:
    store = MemoryResponseStore()
    await store.put(record())
    got = await store.get("resp_1", "red")
    assert got is not None and got.conversation() == [*record().input_items, *record().response["output"]]
    assert await store.get("resp_1", "blue") is None and await store.get("resp_1") is None
    got.response["output"].clear()  # what a caller does to its copy changes nothing stored
    again = await store.get("resp_1", "red")
    assert again is not None and again.response["output"]
    assert await store.delete("resp_1", "blue") is False and await store.delete("resp_1", "red") is True
    assert await store.get("resp_1", "red") is None


async def test_memory_store_bounds_entries_bytes_and_age() -> None:
    clock = Clock()
    store = MemoryResponseStore(max_entries=3, max_bytes=10_000, ttl_s=60, clock=clock)
    for i in range(4):
        await store.put(record(f"resp_{i}"))
    assert len(store) == 3 and await store.get("resp_0", "red") is None  # least recently used went first
    await store.get("resp_1", "red")  # now most recent
    await store.put(record("resp_big", text="x" * 6000))
    assert await store.get("resp_1", "red") is not None and store.bytes <= 10_000
    await store.put(record("resp_huge", text="x" * 20_000))  # over the whole budget: not kept
    assert await store.get("resp_huge", "red") is None and await store.get("resp_big", "red") is not None
    clock.now += 61
    assert await store.get("resp_big", "red") is None


async def test_memory_store_cancels_only_what_runs() -> None:
    store = MemoryResponseStore()
    await store.put(record("resp_run", status="in_progress"))
    await store.put(record("resp_done", status="completed"))
    assert await store.cancel("resp_run", "blue") is None
    cancelled = await store.cancel("resp_run", "red")
    assert cancelled is not None and cancelled.status == "cancelled" and cancelled.response["status"] == "cancelled"
    stored = await store.get("resp_run", "red")
    assert stored is not None and stored.status == "cancelled"
    done = await store.cancel("resp_done", "red")
    assert done is not None and done.status == "completed"


@pytest.fixture()
async def two_replicas(redis_url: str) -> AsyncIterator[tuple[RedisResponseStore, RedisResponseStore, Any]]:
    a = RedisResponseStore.from_url(redis_url, ttl_s=30)
    b = RedisResponseStore.from_url(redis_url, ttl_s=30)
    probe = aioredis.from_url(redis_url)
    yield a, b, probe
    await a.close()
    await b.close()
    await probe.aclose()


@pytest.mark.redis
async def test_redis_store_is_shared_between_replicas(two_replicas: Any) -> None:
    a, b, probe = two_replicas
    await a.put(record("resp_shared", status="in_progress"))
    got = await b.get("resp_shared", "red")
    assert got is not None and got.conversation()[-1]["content"][0]["text"] == "hi"
    assert await b.get("resp_shared", "blue") is None and await b.get("resp_missing", "red") is None
    ttl = await probe.pttl("cachegate:resp:resp_shared")
    assert 0 < ttl <= 30_000
    assert await b.cancel("resp_shared", "blue") is None
    cancelled = await b.cancel("resp_shared", "red")
    assert cancelled is not None and cancelled.status == "cancelled"
    seen = await a.get("resp_shared", "red")
    assert seen is not None and seen.status == "cancelled" and seen.response["status"] == "cancelled"
    await a.put(record("resp_shared", status="completed", text="final"))  # a later write replaces it
    done = await b.cancel("resp_shared", "red")
    assert (
        done is not None and done.status == "completed" and done.response["output"][0]["content"][0]["text"] == "final"
    )
    assert await b.delete("resp_shared", "red") is True
    assert await probe.exists("cachegate:resp:resp_shared") == 0


@pytest.mark.redis
async def test_redis_store_without_teams(two_replicas: Any) -> None:
    a, b, _ = two_replicas
    await a.put(record("resp_open", team=None))
    got = await b.get("resp_open")
    assert got is not None and got.team is None
    assert await b.get("resp_open", "red") is None


def test_a_record_round_trips_through_its_bytes() -> None:
    original = record("resp_rt", team=None, status="in_progress")
    again = StoredResponse.loads(original.dumps())
    assert again == original and again is not original
    assert StoredResponse.loads(original.dumps().decode()) == original  # Redis may hand back text
    assert StoredResponse("r", "t", "m", "queued", 1.0).conversation() == []


async def test_memory_store_counts_bytes_exactly_across_replace_cancel_and_delete() -> None:
    store = MemoryResponseStore()
    await store.put(record("resp_a", status="in_progress"))
    await store.put(record("resp_b"))
    await store.put(record("resp_a", status="in_progress", text="longer text"))  # replaced, not added
    assert len(store) == 2
    assert store.bytes == len(record("resp_a", status="in_progress", text="longer text").dumps()) + len(
        record("resp_b").dumps()
    )
    await store.cancel("resp_a", "red")
    stored = await store.get("resp_a", "red")
    assert stored is not None and store.bytes == len(stored.dumps()) + len(record("resp_b").dumps())
    assert await store.delete("resp_missing", "red") is False
    assert await store.delete("resp_a", "red") is True and store.bytes == len(record("resp_b").dumps())
    await store.close()
    assert len(store) == 0 and store.bytes == 0


async def test_memory_store_a_write_restarts_the_expiry_and_expired_records_go_on_the_next_write() -> None:
    clock = Clock()
    store = MemoryResponseStore(ttl_s=60, clock=clock)
    await store.put(record("resp_old"))
    await store.put(record("resp_kept"))
    clock.now += 50
    await store.put(record("resp_kept"))  # written again: 60 s from now
    clock.now += 20
    await store.put(record("resp_new"))
    assert len(store) == 2, "the expired record is dropped by a write, not kept until read"
    assert await store.get("resp_old", "red") is None and await store.get("resp_kept", "red") is not None


@pytest.mark.redis
async def test_redis_store_misses_and_ttl(two_replicas: Any) -> None:
    a, b, probe = two_replicas
    assert await a.cancel("resp_nothing", "red") is None
    assert await a.delete("resp_nothing", "red") is False
    await a.put(record("resp_t"))
    assert await b.delete("resp_t", "blue") is False and await probe.exists("cachegate:resp:resp_t") == 1
    await probe.pexpire("cachegate:resp:resp_t", 1000)
    await a.put(record("resp_t", text="again"))  # a write restarts the expiry
    assert await probe.pttl("cachegate:resp:resp_t") > 1000
    got = await b.get("resp_t", "red")
    assert got is not None and got.response["output"][0]["content"][0]["text"] == "again"
