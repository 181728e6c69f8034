"""One upstream connection and its response (gateway/http/wire.py, ``WireResponse``) over real loopback
sockets: the head as read, the body taken with ``receive``/``take``/``aiter_raw``, the silence
(``SILENCE``, then ``ReadTimeout``), ``readable``, reading held and paused past the high-water mark,
the ``sink`` callback, and what ``close`` does with the connection.

How llhttp frames answers (malformed heads and chunks, interim answers, limits, the relay's shortcut)
is in tests/gateway/test_wire_framing.py; the pool (``WireClient``) in test_wire_pool.py beside this.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gateway.http import wire
from gateway.http.wire import SILENCE
from tests.gateway.test_wire import client, read_request, server

CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


async def test_the_head_is_read_with_lower_case_names_and_the_last_repeated_value() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 201 Created\r\nX-Trace: one\r\nx-trace: two\r\nContent-Type: text/plain\r\n"
            b"Content-Length: 3\r\n\r\nabc"
        )
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        assert response.status_code == 201 and not response.chunked
        assert response.headers == {"x-trace": "two", "content-type": "text/plain", "content-length": "3"}
        assert await response.receive() == b"abc"
        assert await response.receive() == b"" and response.take() == b"", "the end, as often as asked"
        response.close()
        await wc.aclose()


async def test_a_reused_connection_starts_each_response_afresh() -> None:
    """``reset``: nothing of the first response (headers, status, body, its end) shows in the second."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\nx-first: 1\r\ncontent-length: 5\r\n\r\nfirst")
        await writer.drain()
        await read_request(reader)
        writer.write(CHUNKED + b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, accepted):
        wc = client()
        first = await wc.post(url + "/x", {}, b"{}")
        assert [part async for part in first.aiter_raw()] == [b"first"]
        first.close()
        second = await wc.post(url + "/x", {}, b"{}")
        assert len(accepted) == 1 and second is first, "the same connection (and protocol object), reset"
        assert (second.status_code, second.chunked, "x-first" in second.headers) == (200, True, False)
        assert b"".join([part async for part in second.aiter_raw()]) == b"second"
        second.close()
        await wc.aclose()


async def test_silence_gives_keep_alive_signals_then_a_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED + b"5\r\nhello\r\n")
        await writer.drain()
        await reader.read()  # silent from here

    async with server(handler) as (url, _):
        wc = client(idle_s=0.35)
        response = await wc.post(url + "/x", {}, b"{}")
        response.watch_silence(0.1)
        t0 = time.monotonic()
        assert await response.receive() == b"hello"
        got: list[bytes] = []
        with pytest.raises(httpx.ReadTimeout):
            while True:
                got.append(await response.receive())
        took = time.monotonic() - t0
        assert got and set(got) == {SILENCE} and 2 <= len(got) <= 4, got
        assert 0.3 < took < 1.5, took
        response.close()
        assert wc.open == 0, "a broken response's connection is closed, its slot freed"
        await wc.aclose()


async def test_aiter_raw_skips_the_silence_and_ends_with_the_body() -> None:
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED + b"1\r\na\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"1\r\nb\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        response.watch_silence(0.02)
        asyncio.get_running_loop().call_later(0.1, go_on.set)  # a few keep-alive periods of silence
        assert [part async for part in response.aiter_raw()] == [b"a", b"b"]
        response.close()
        await wc.aclose()


async def test_readable_waits_for_body_bytes_and_takes_none_of_them() -> None:
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED)
        await writer.drain()
        await go_on.wait()
        writer.write(b"4\r\nbody\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        gate = asyncio.ensure_future(response.readable())
        await asyncio.sleep(0.05)
        assert not gate.done() and response.take() is None, "a head alone opens nothing"
        go_on.set()
        await asyncio.wait_for(gate, 2)
        assert await response.receive() == b"body", "still there for the reader"
        response.close()
        await wc.aclose()


async def test_hold_pauses_reading_from_upstream_until_released() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED)
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        assert response.transport is not None and response.transport.is_reading()
        response.hold(True)
        assert response.paused and not response.transport.is_reading()
        response.hold(False)
        assert not response.paused and response.transport.is_reading()
        response.close()
        await wc.aclose()


async def test_unread_bytes_past_the_high_water_mark_pause_reading_until_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "_HIGH_WATER", 1000)
    payload = bytes(range(256)) * 40  # 10 KiB, in frames of 2 KiB

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED)
        for i in range(0, len(payload), 2048):
            part = payload[i : i + 2048]
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        for _ in range(100):
            if response.paused:
                break
            await asyncio.sleep(0.005)
        assert response.paused and response.transport is not None and not response.transport.is_reading()
        assert response.pending > 1000
        body = response.take()
        assert body is not None and not response.paused and response.transport.is_reading(), "taken: reading again"
        while chunk := await response.receive():
            body += chunk
        assert body == payload
        response.close()
        await wc.aclose()


async def test_a_sink_is_called_instead_of_waking_a_reader() -> None:
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED)
        await writer.drain()
        await go_on.wait()
        writer.write(b"3\r\none\r\n")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        seen: list[bytes | None] = []
        done = asyncio.Event()

        def sink() -> None:
            data = response.take()
            seen.append(data)
            if data == b"":
                done.set()

        response.sink = sink
        go_on.set()
        await asyncio.wait_for(done.wait(), 2)
        assert seen == [b"one", b""]
        response.close()
        assert wc.open == 1 and sum(len(q) for q in wc.idle.values()) == 1, "read to the end: pooled"
        await wc.aclose()


async def test_close_pools_a_finished_response_and_closes_an_unfinished_one() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789")
            await writer.drain()

    async with server(handler) as (url, accepted):
        wc = client()
        finished = await wc.post(url + "/x", {}, b"{}")
        assert await finished.receive() == b"0123456789" and await finished.receive() == b""
        finished.close()
        assert wc.open == 1 and sum(len(q) for q in wc.idle.values()) == 1
        unread = await wc.post(url + "/x", {}, b"{}")
        assert len(accepted) == 1
        await asyncio.sleep(0.02)
        assert unread.done, "the whole answer has arrived..."
        unread.close()  # ... but the caller did not take it: the connection is not handed to the next one
        unread.close()  # a second close changes nothing
        assert wc.open == 0 and not any(wc.idle.values()) and unread.transport is None
        again = await wc.post(url + "/x", {}, b"{}")
        assert await again.receive() == b"0123456789" and len(accepted) == 2
        again.close()
        await wc.aclose()


async def test_an_upstream_that_closes_before_its_head_is_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-")  # then the server closes

    async with server(handler) as (url, _):
        wc = client()
        with pytest.raises(httpx.RemoteProtocolError, match="closed the connection mid-response") as info:
            await wc.post(url + "/x", {}, b"{}")
        assert not isinstance(info.value, wire.UpstreamMalformed), "a close is not a malformation"
        assert wc.open == 0
        await wc.aclose()


async def test_a_body_cut_short_by_the_close_is_an_error_not_an_end() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/x", {}, b"{}")
        assert await response.receive() == b"only this"
        with pytest.raises(httpx.RemoteProtocolError):
            await response.receive()
        assert response.body_now(1 << 20) is None
        response.close()
        assert wc.open == 0
        await wc.aclose()
