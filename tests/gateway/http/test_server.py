"""The gateway's HTTP server protocol (gateway/http/server.py) over real loopback sockets, in this
test's event loop: the header and body timeouts, the header limits, the keep-alive timeout on the
connection's one timer, the client leaving (``watch_lost``), the connection lent to the relay
(``direct_transport``, ``on_writable``) and a whole response written at once (``respond``).

Each test serves a small ASGI app with ``LimitedHttpToolsProtocol`` on ``loop.create_server`` (what
uvicorn does per connection) with limits in tenths of a second. The served gateway's own figures
(seconds, through ``cachegate serve``) are in tests/gateway/test_http_limits.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.http import server as http_server
from gateway.http.errors import envelope
from gateway.http.server import DIRECT, ENV, LimitedHttpToolsProtocol, Limits, limits, refusal

App = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]
FAST = Limits(
    header_timeout_s=0.15, body_timeout_s=0.3, body_idle_timeout_s=0.15, max_header_bytes=2048, max_headers=12
)
KEEP_ALIVE_S = 0.2
DATE = b"Thu, 01 Jan 2026 00:00:00 GMT"


async def ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def serving(
    app: App, monkeypatch: pytest.MonkeyPatch, lim: Limits = FAST
) -> AsyncIterator[tuple[int, list[LimitedHttpToolsProtocol]]]:
    """``app`` behind the protocol on a free port: yields the port and the protocols made so far."""
    monkeypatch.setattr(http_server, "_limits", lim)
    config = uvicorn.Config(
        app, http=LimitedHttpToolsProtocol, lifespan="off", log_config=None, access_log=False, timeout_keep_alive=5
    )
    config.timeout_keep_alive = KEEP_ALIVE_S  # type: ignore[assignment]  # a float: the protocol's timer takes one
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", DATE), *config.encoded_headers]  # as uvicorn's Server keeps them
    made: list[LimitedHttpToolsProtocol] = []

    def factory() -> LimitedHttpToolsProtocol:
        protocol = LimitedHttpToolsProtocol(config=config, server_state=state, app_state={})
        made.append(protocol)
        return protocol

    srv = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    try:
        yield srv.sockets[0].getsockname()[1], made
    finally:
        srv.close()
        for protocol in made:
            if protocol.transport is not None:
                protocol.transport.close()
        await asyncio.sleep(0)


async def read_all(reader: asyncio.StreamReader, timeout: float = 3.0) -> tuple[bytes, float]:
    """Everything until the server closes the connection, and how long that took."""
    t0 = time.monotonic()
    data = await asyncio.wait_for(reader.read(), timeout)
    return data, time.monotonic() - t0


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    """One content-length response: (status, lower-case headers, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
    lines = head[:-4].split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    body = await asyncio.wait_for(reader.readexactly(int(headers.get(b"content-length", b"0"))), 3)
    return int(lines[0].split()[1]), headers, body


def error_of(answer: bytes) -> dict[str, Any]:
    return dict(orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"])


GET = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


# ---- the settings and the refusal -------------------------------------------------------------------


def test_limits_are_read_once_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "_limits", None)
    monkeypatch.setenv(ENV, orjson.dumps({"header_timeout_s": 2.5, "max_headers": 9, "keep_alive_s": 75}).decode())
    got = limits()
    assert got == Limits(header_timeout_s=2.5, max_headers=9), "known fields taken, the others (keep_alive_s) left"
    monkeypatch.setenv(ENV, orjson.dumps({"header_timeout_s": 1.0}).decode())
    assert limits() is got, "read once per process"
    monkeypatch.setattr(http_server, "_limits", None)
    monkeypatch.delenv(ENV)
    assert limits() == Limits()


@pytest.mark.parametrize(
    ("status", "reason"), [(400, b"Bad Request"), (408, b"Request Timeout"), (431, b"Request Header Fields Too Large")]
)
def test_a_refusal_is_a_whole_json_response_that_closes(status: int, reason: bytes) -> None:
    raw = refusal(status, "why", "some_code")
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 %d %s" % (status, reason)
    headers = dict(line.split(b": ", 1) for line in lines[1:])
    assert headers == {
        b"content-type": b"application/json",
        b"content-length": str(len(body)).encode(),
        b"connection": b"close",
    }
    assert orjson.loads(body) == envelope(status, "why", "some_code")


# ---- header limits and timeouts ---------------------------------------------------------------------


async def test_unfinished_headers_and_a_silent_connection_get_408(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(ok_app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ")
        answer, took = await read_all(reader)
        assert answer.startswith(b"HTTP/1.1 408 ") and error_of(answer)["code"] == "request_timeout"
        assert 0.12 < took < 1.0, took
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # says nothing at all
        answer, took = await read_all(reader)
        assert answer.startswith(b"HTTP/1.1 408 ") and 0.12 < took < 1.0
        writer.close()


async def test_header_bytes_and_count_past_the_limits_are_431(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(ok_app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 3000)  # never finished: counted as it arrives
        answer, took = await read_all(reader)
        assert answer.startswith(b"HTTP/1.1 431 ") and error_of(answer)["code"] == "headers_too_large"
        assert took < 0.2, "refused at once, not at the header timeout"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(13)) + b"\r\n")
        answer, _ = await read_all(reader)
        assert answer.startswith(b"HTTP/1.1 431 ") and error_of(answer)["code"] == "too_many_headers"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # at the limit: served
        writer.write(b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(12)) + b"\r\n")
        assert (await read_response(reader))[0] == 200
        writer.close()


async def test_bytes_that_are_not_http_are_a_json_400(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(ok_app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        answer, _ = await read_all(reader)
        assert answer.startswith(b"HTTP/1.1 400 ") and error_of(answer)["code"] == "invalid_http"
        assert b"content-type: application/json" in answer
        writer.close()


# ---- bodies -----------------------------------------------------------------------------------------


async def test_a_stalled_body_closes_the_connection_and_the_app_sees_its_client_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                return

    async with serving(app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
        answer, took = await read_all(reader)
        assert answer == b"" and 0.12 < took < 1.0, "closed without an answer after the idle timeout"
        writer.close()
    assert seen[-1] == "http.disconnect"


async def test_a_body_that_trickles_is_cut_at_the_whole_body_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces arriving within ``body_idle_timeout_s`` of each other do not extend ``body_timeout_s``."""
    async with serving(ok_app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        t0 = time.monotonic()
        closed = asyncio.ensure_future(reader.read())
        while not closed.done() and time.monotonic() - t0 < 2:
            writer.write(b"x")
            await asyncio.wait([closed], timeout=0.1)
        assert closed.done() and closed.result() == b""
        took = time.monotonic() - t0
        assert 0.28 < took < 1.0, f"{took:.2f} s: past body_timeout_s (0.3), though no gap reached the idle timeout"
        writer.close()


# ---- keep-alive -------------------------------------------------------------------------------------


async def test_keep_alive_timeout_then_the_next_requests_own_header_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(ok_app, monkeypatch) as (port, made):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        assert (await read_response(reader))[0] == 200
        await asyncio.sleep(0.1)  # within the keep-alive timeout: still served
        writer.write(GET)
        assert (await read_response(reader))[0] == 200
        answer, took = await read_all(reader)
        assert answer == b"" and 0.18 < took < 1.0, "an idle kept-alive connection closes after the keep-alive timeout"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        assert (await read_response(reader))[0] == 200
        writer.write(b"GET / HTTP/1.1\r\nx-slow: ")  # the next request's headers never finish
        answer, took = await read_all(reader)
        assert answer.startswith(b"HTTP/1.1 408 ") and 0.12 < took < 1.0, "the header timeout's answer"
        writer.close()
    assert len(made) == 2


# ---- the request path's hooks -----------------------------------------------------------------------


async def test_watch_lost_calls_back_once_when_the_client_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    after: list[bool] = []
    left = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        protocol = scope["extensions"][DIRECT]
        assert isinstance(protocol, LimitedHttpToolsProtocol)
        assert (scope["client"], scope["server"]) == (protocol.client, protocol.server)
        unwatched = lambda: calls.append("unwatched")  # noqa: E731
        assert protocol.watch_lost(unwatched)
        protocol.unwatch_lost(unwatched)
        assert protocol.watch_lost(lambda: (calls.append("lost"), left.set()))
        await left.wait()
        after.append(protocol.watch_lost(lambda: calls.append("late")))

    async with serving(app, monkeypatch) as (port, _):
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        await asyncio.sleep(0.05)
        writer.close()
        await asyncio.wait_for(left.wait(), 2)
        await asyncio.sleep(0.01)
    assert calls == ["lost"] and after == [False], "once, only the callback still watched; none after the close"


async def test_the_connection_is_lent_only_while_a_chunked_response_is_open(monkeypatch: pytest.MonkeyPatch) -> None:
    lent: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        protocol = scope["extensions"][DIRECT]
        lent.append(protocol.direct_transport() is not None)  # not started
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        transport = protocol.direct_transport()
        lent.append(transport is not None)
        transport.write(b"6\r\ndirect\r\n")  # a chunk frame written to the client's connection itself
        await send({"type": "http.response.body", "body": b"via-send", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        lent.append(protocol.direct_transport() is not None)  # complete

    async def sized(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        lent.append(scope["extensions"][DIRECT].direct_transport() is not None)  # not chunked
        await send({"type": "http.response.body", "body": b"x"})

    async with serving(app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert b"transfer-encoding: chunked" in head
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 3)
        assert body == b"6\r\ndirect\r\n8\r\nvia-send\r\n0\r\n\r\n"
        writer.close()
    async with serving(sized, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        assert (await read_response(reader))[2] == b"x"
        writer.close()
    assert lent == [False, True, False, False]


async def test_the_relay_is_told_when_the_client_stops_taking_and_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    """``on_writable``: False when the client's transport passes its high-water mark, True once it drained."""
    told: list[bool] = []
    paused: list[bool] = []
    drained = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        protocol = scope["extensions"][DIRECT]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        protocol.on_writable = lambda ok: (told.append(ok), ok and drained.set())
        data = b"x" * (8 << 20)  # far past the kernel's and the transport's buffers
        protocol.direct_transport().write(b"%x\r\n%s\r\n" % (len(data), data))
        paused.append(protocol.writing_paused())
        await drained.wait()
        paused.append(protocol.writing_paused())
        await send({"type": "http.response.body", "body": b""})

    async with serving(app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
        writer.write(GET)
        await asyncio.sleep(0.05)  # the client takes nothing meanwhile (its reader stops at 128 KiB)
        assert told == [False]
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):
            received += await asyncio.wait_for(reader.read(1 << 16), 5)
        assert len(received) > 8 << 20
        writer.close()
    assert told == [False, True] and paused == [True, False]


def _respond_app(results: list[bool], headers: list[tuple[bytes, bytes]] | None = None) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        protocol = scope["extensions"][DIRECT]
        body = b'{"ok":true}'
        first = protocol.respond(scope, 200, headers or [(b"content-type", b"application/json")], body)
        results.append(first)
        if not first:  # refused: uvicorn's send, as the request path does
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
            await send({"type": "http.response.body", "body": b"send"})
            return
        results.append(protocol.respond(scope, 200, [], b"again"))  # already started: refused, nothing written

    return app


async def test_respond_writes_a_whole_response_at_once_and_keeps_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    results: list[bool] = []
    async with serving(_respond_app(results), monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(2):  # kept alive: the next request on the same connection is served
            writer.write(GET)
            status, headers, body = await read_response(reader)
            assert (status, body) == (200, b'{"ok":true}')
            assert headers[b"content-type"] == b"application/json" and headers[b"content-length"] == b"11"
            assert headers[b"date"] == DATE and headers[b"server"] == b"uvicorn" and b"connection" not in headers
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert headers[b"connection"] == b"close" and body == b'{"ok":true}'
        assert (await read_all(reader))[0] == b"", "closed after it"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # HEAD: no body to write, uvicorn's send
        writer.write(b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 3)
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 4" in head
        writer.close()
    assert results == [True, False, True, False, True, False, False]


async def test_respond_leaves_a_header_uvicorn_would_refuse_to_send(monkeypatch: pytest.MonkeyPatch) -> None:
    results: list[bool] = []
    app = _respond_app(results, [(b"x-bad", b"a\r\nx-injected: 1")])
    async with serving(app, monkeypatch) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(GET)
        status, headers, body = await read_response(reader)
        assert (status, body) == (200, b"send") and b"x-injected" not in headers
        writer.close()
    assert results == [False]
