"""backends/sim/disagg_rooms.py: the prefill twin's KV rooms (one hand-over each: 200, then 409; 410 once
failed; 408 not ready in time; tombstones forgotten) and its bootstrap server over real loopback HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from backends.sim import disagg_rooms
from backends.sim.disagg_rooms import Rooms
from backends.sim.testing import free_port


async def test_a_computed_room_is_handed_over_once() -> None:
    rooms = Rooms()
    rooms.computed(7, tokens=120, cached=64)
    assert await rooms.fetch(7, 1.0) == (200, {"room": 7, "tokens": 120, "cached_tokens": 64})
    status, body = await rooms.fetch(7, 1.0)
    assert status == 409 and "already handed over" in str(body["error"]) and rooms.fetches == 1


async def test_a_fetch_waits_for_the_prefill_to_compute_its_room() -> None:
    rooms = Rooms()
    waiting = asyncio.create_task(rooms.fetch(8, 5.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    rooms.computed(8, 10, 0)
    assert (await waiting)[0] == 200


async def test_a_room_not_computed_in_time_is_408_and_a_failed_one_410() -> None:
    rooms = Rooms()
    status, body = await rooms.fetch(9, 0.02)
    assert status == 408 and "not computed within 0.02 s" in str(body["error"])
    rooms.fail(9)
    assert (await rooms.fetch(9, 1.0))[0] == 410
    assert rooms.rooms[9].failed and rooms.rooms[9].ended_at is not None


async def test_failing_a_room_already_taken_does_not_mark_it_failed() -> None:
    rooms = Rooms()
    rooms.computed(1, 5, 0)
    assert (await rooms.fetch(1, 1.0))[0] == 200
    rooms.fail(1)  # the prefill leg ends after the hand-over (e.g. its client left)
    assert not rooms.rooms[1].failed and (await rooms.fetch(1, 1.0))[0] == 409


def test_ended_rooms_are_forgotten_after_the_tombstone_time(monkeypatch: pytest.MonkeyPatch) -> None:
    rooms = Rooms()
    rooms.fail(1)
    rooms.computed(2, 5, 0)  # computed, still open: kept however old
    rooms.rooms[2].ended_at = None
    now = time.monotonic()
    monkeypatch.setattr(disagg_rooms.time, "monotonic", lambda: now + disagg_rooms.TOMBSTONE_S + 1)
    rooms.room(3)
    assert set(rooms.rooms) == {2, 3}


@pytest.fixture()
async def bootstrap() -> AsyncIterator[tuple[Rooms, str]]:
    rooms, port = Rooms(), free_port()
    await rooms.start("127.0.0.1", port)
    try:
        yield rooms, f"http://127.0.0.1:{port}"
    finally:
        await rooms.stop()
        assert rooms.server is None


async def test_the_bootstrap_server_hands_a_room_over_http(bootstrap: tuple[Rooms, str]) -> None:
    rooms, url = bootstrap
    async with httpx.AsyncClient(trust_env=False) as c:
        pending = asyncio.create_task(c.get(f"{url}/kv/42", params={"wait": 5}))
        await asyncio.sleep(0.02)
        rooms.computed(42, 300, 256)
        r = await pending
        assert r.status_code == 200 and r.headers["connection"] == "close"
        assert r.json() == {"room": 42, "tokens": 300, "cached_tokens": 256}
        assert (await c.get(f"{url}/kv/42")).status_code == 409
        assert (await c.get(f"{url}/kv/43", params={"wait": 0.01})).status_code == 408


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/kv"), ("GET", "/kv/abc"), ("GET", "/rooms/1"), ("POST", "/kv/1")]
)
async def test_the_bootstrap_server_knows_one_route(bootstrap: tuple[Rooms, str], method: str, path: str) -> None:
    _, url = bootstrap
    async with httpx.AsyncClient(trust_env=False) as c:
        r = await c.request(method, url + path)
        assert r.status_code == 404 and r.json() == {"error": "not found"}


async def test_the_bootstrap_server_drops_a_malformed_request(bootstrap: tuple[Rooms, str]) -> None:
    rooms, url = bootstrap
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(b"GARBAGE\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 2) == b""  # closed without an answer
    writer.close()
    rooms.computed(5, 1, 0)
    async with httpx.AsyncClient(trust_env=False) as c:
        assert (await c.get(f"{url}/kv/5")).status_code == 200  # and still serves
