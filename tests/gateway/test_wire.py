"""The lean upstream client (gateway/http/wire.py) and the relay (gateway/relay/events.py) over real loopback sockets.

A raw asyncio server plays the upstream so each test controls the exact bytes and their split
across TCP writes: chunked bodies cut at every position, keep-alive reuse, a server that closed an
idle connection, silence (keep-alive comments, then the idle timeout), the connection budget.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from gateway.http import wire_pool
from gateway.http.wire import SILENCE
from gateway.http.wire_pool import WireClient
from gateway.relay.events import relay_sse
from gateway.relay.proxy import Result, StreamWatch, read_body
from tests.fake_upstream import USAGE, chunk

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """Serve ``handler`` on a free port; yields the base URL and a list of accepted connection ids."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(len(accepted))
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", accepted
    finally:
        srv.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    return await reader.readexactly(length)


def client(**kw: Any) -> WireClient:
    args = {"connect_timeout_s": 1.0, "idle_s": 5.0, "keepalive_expiry_s": 3.0, "max_connections": 10} | kw
    return WireClient(**args)


EVENTS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hello"}),
    chunk({"reasoning_content": "hm"}),
    chunk({}, finish="stop"),
    chunk(usage=USAGE, choices=False),
    b"data: [DONE]\n\n",
]
BODY = b"".join(EVENTS)


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


@pytest.mark.parametrize("cut", [1, 3, 7, 50, 111, 400])
async def test_chunked_body_survives_any_split(cut: int) -> None:
    wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(EVENTS)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(0, len(wire), cut):
            writer.write(wire[i : i + cut])
            await writer.drain()
            await asyncio.sleep(0)
        await reader.read()

    async with server(handler) as (url, _):
        wc = client()
        response = await wc.post(url + "/v1/chat/completions", {"content-type": "application/json"}, b"{}")
        body = b"".join([part async for part in response.aiter_raw()])
        await response.aclose()
        assert response.status_code == 200 and body == BODY


async def test_keep_alive_reuse_and_reconnect_after_server_closed_idle() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # two requests per connection, then the server closes it
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}")
            await writer.drain()

    async with server(handler) as (url, accepted):
        wc = client()
        for _ in range(4):
            response = await wc.post(url + "/x", {}, b"{}")
            assert b"".join([p async for p in response.aiter_raw()]) == b"{}"
            assert response.headers["content-type"] == "application/json"
            await response.aclose()
            await asyncio.sleep(0.05)
        assert len(accepted) == 2, "one connection per two requests: reused, then replaced once closed"
        assert wc.open == 1


async def test_body_now_only_for_a_whole_body_within_the_limit() -> None:
    """``body_now`` gives the body without waiting once all of it arrived, and None while it has not
    (the caller then waits with ``read_body``) or when it is over the limit; either way the
    connection goes back to the pool once read to the end."""
    go_on = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello world")
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\nhello ")
        await writer.drain()
        await go_on.wait()
        writer.write(b"world")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, accepted):
        wc = client()
        whole = await wc.post(url + "/x", {}, b"{}")
        for _ in range(100):  # the body follows the head in the same write, but give it its read
            if whole.done:
                break
            await asyncio.sleep(0.01)
        assert whole.body_now(10) is None, "over the limit: left to read_body"
        assert whole.body_now(11) == b"hello world"
        whole.close()
        part = await wc.post(url + "/x", {}, b"{}")
        await asyncio.sleep(0.05)
        assert part.body_now(1 << 20) is None, "half of it: nothing to take without waiting"
        go_on.set()
        assert await read_body(part) == b"hello world"
        part.close()
        assert len(accepted) == 1 and wc.open == 1


async def test_relay_keepalive_then_idle_timeout_ends_with_error_and_done() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked([EVENTS[0], EVENTS[1]])[:-5])
        await writer.drain()
        await reader.read()  # silent until the gateway gives up

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with server(handler) as (url, _):
        wc = client(idle_s=0.5)
        response = await wc.post(url + "/x", {}, b"{}")
        result = Result()
        firsts: list[bool] = []
        await relay_sse(response, send, StreamWatch(result, False, lambda: firsts.append(True)), 0.15, [])
        await response.aclose()
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert body.startswith(EVENTS[0] + EVENTS[1])
    assert body.count(SILENCE) >= 2, "keep-alive comments during the silence"
    assert b'"code":"upstream_timeout"' in body and body.endswith(b"data: [DONE]\n\n")
    assert result.stream_error == "timeout" and firsts == [True] and sent[-1]["more_body"] is False
    assert wc.open == 0, "a broken response closes its connection and frees its slot"


async def test_relay_strips_only_the_injected_usage_chunk_and_coalesces() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(EVENTS))
        await writer.drain()
        await reader.read()

    for strip in (True, False):
        sent: list[bytes] = []

        async def send(message: dict[str, Any], sent: list[bytes] = sent) -> None:
            sent.append(message.get("body", b""))

        async with server(handler) as (url, _):
            response = await client().post(url + "/x", {}, b"{}")
            result = Result()
            await relay_sse(response, send, StreamWatch(result, strip, lambda: None), 15.0, [])
            await response.aclose()
        expected = b"".join(e for e in EVENTS if not (strip and e == EVENTS[4]))
        assert b"".join(sent) == expected
        assert result.usage == USAGE and result.first_token_at is not None and result.finish_reasons == ["stop"]
        assert len(sent) <= 4, "events that arrive together leave together"


async def test_budget_full_is_pool_timeout_and_refused_is_connect_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with server(handler) as (url, _):
        wc = client(max_connections=1, connect_timeout_s=0.2)
        held = await wc.post(url + "/x", {}, b"{}")
        with pytest.raises(httpx.PoolTimeout):
            await wc.post(url + "/x", {}, b"{}")
        await held.aclose()  # not read to the end: closed, slot freed
        assert wc.open == 0
        again = await wc.post(url + "/x", {}, b"{}")
        await again.aclose()
    with pytest.raises(httpx.ConnectError):
        await client().post(url + "/x", {}, b"{}")


async def test_idle_connection_to_another_upstream_gives_its_slot_up() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    async with server(handler) as (a, _), server(handler) as (b, _):
        wc = client(max_connections=1, connect_timeout_s=0.2)
        for url in (a, b, a):
            response = await wc.post(url + "/x", {}, b"{}")
            assert b"".join([p async for p in response.aiter_raw()]) == b"{}"
            await response.aclose()
        assert wc.open == 1


async def test_get_reads_a_small_answer_whole_on_a_kept_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's checks and polls (``WireClient.get``): a GET line, the answer read whole, the
    connection reused for the next one; a silent server is a ``ReadTimeout``, an answer past the
    limit refused, a closed port a ``ConnectError`` (all ``httpx.HTTPError``, as the pool catches)."""
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head.split(b"\r\n")[0])
            path = head.split(b" ")[1]
            if path == b"/silent":
                await asyncio.sleep(5)
            body = b'{"loads": [{"num_running_reqs": 3}]}' if path == b"/v1/loads" else b"x" * 200
            if path == b"/health":
                body = b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async with server(handler) as (url, accepted):
        wc = client()
        loads = await wc.get(url + "/v1/loads", {"authorization": "Bearer k"}, 2.0)
        health = await wc.get(url + "/health", {}, 2.0)
        assert (loads.status_code, loads.json(), health.status_code, health.content) == (
            200,
            {"loads": [{"num_running_reqs": 3}]},
            200,
            b"",
        )
        assert seen == [b"GET /v1/loads HTTP/1.1", b"GET /health HTTP/1.1"]
        assert len(accepted) == 1  # one connection, kept
        with pytest.raises(httpx.ReadTimeout):
            await wc.get(url + "/silent", {}, 0.2)
        assert wc.open == 0  # the unanswered connection did not go back to the pool: closed, its slot freed
        monkeypatch.setattr(wire_pool, "GET_LIMIT", 100)
        with pytest.raises(httpx.DecodingError):
            await wc.get(url + "/big", {}, 2.0)
        await wc.aclose()
    with pytest.raises(httpx.ConnectError):
        await client().get(url + "/health", {}, 1.0)
