"""The lean client's connection pool (gateway/http/wire_pool.py, ``WireClient``) over real loopback
sockets: the request it writes, keep-alive expiry, the connection budget and its waiters, a caller
cancelled while waiting for the head, ``get``'s answers, and TLS verified against a backend's own CA
(``trust``) or the system's store.

The budget's ``PoolTimeout``, reuse after the server closed an idle connection and ``get``'s limits are
also in tests/gateway/test_wire.py (with the relay); one response's life in test_wire.py beside this.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import trustme

from gateway.http.wire_pool import WireClient, WireReply
from tests.gateway.test_wire import client, read_request, server

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


async def answer_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()


async def test_the_request_written_has_one_host_and_the_bodys_own_length() -> None:
    heads: list[bytes] = []
    bodies: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            heads.append(head)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            bodies.append(await reader.readexactly(length))
            writer.write(OK)
            await writer.drain()

    async with server(handler) as (url, _):
        wc = client()
        headers = {"Host": "evil", "Content-Length": "999", "authorization": "Bearer k", "x-request-id": "cg-1"}
        response = await wc.post(url + "/v1/chat/completions?a=1&b=2", headers, b'{"x":1}')
        response.close()
        response = await wc.post(url, {}, b"")  # no path: "/"
        response.close()
        await wc.aclose()
    netloc = url.split("://")[1].encode()
    assert heads[0] == (
        b"POST /v1/chat/completions?a=1&b=2 HTTP/1.1\r\nhost: %s\r\ncontent-length: 7\r\n"
        b"authorization: Bearer k\r\nx-request-id: cg-1\r\n\r\n" % netloc
    )
    assert heads[1] == b"POST / HTTP/1.1\r\nhost: %s\r\ncontent-length: 0\r\n\r\n" % netloc
    assert bodies == [b'{"x":1}', b""]


async def test_an_idle_connection_past_its_keep_alive_expiry_is_not_reused() -> None:
    async with server(answer_all) as (url, accepted):
        wc = client(keepalive_expiry_s=0.05)
        for pause in (0.0, 0.1):
            await asyncio.sleep(pause)
            response = await wc.post(url + "/x", {}, b"{}")
            assert await response.receive() == b"{}"
            response.close()
        assert len(accepted) == 2, "the expired connection was closed and a new one opened"
        assert wc.open == 1, "the expired one's slot was given back"
        await wc.aclose()


async def test_pooled_connections_are_kept_per_upstream() -> None:
    async with server(answer_all) as (a, accepted_a), server(answer_all) as (b, accepted_b):
        wc = client()
        for url in (a, b, a, b):
            response = await wc.post(url + "/x", {}, b"{}")
            assert await response.receive() == b"{}"
            response.close()
        assert (len(accepted_a), len(accepted_b), wc.open) == (1, 1, 2)
        await wc.aclose()
        assert not wc.idle, "aclose closes every idle connection"


def _one_stream_then_answers(release: asyncio.Event) -> Handler:
    """The first request on a connection gets a chunked answer that ends when ``release`` is set."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await answer_all(reader, writer)

    return handler


async def test_a_caller_waiting_for_a_slot_gets_the_one_a_closed_connection_gives_back() -> None:
    async with server(_one_stream_then_answers(asyncio.Event())) as (url, accepted):
        wc = client(max_connections=1, connect_timeout_s=2.0)
        held = await wc.post(url + "/x", {}, b"{}")
        waiting = asyncio.ensure_future(wc.post(url + "/x", {}, b"{}"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and wc.open == 1, "waits within the connect timeout, no second connection"
        held.close()  # not read to the end: closed, its slot goes to the waiter
        second = await asyncio.wait_for(waiting, 1)
        assert second.status_code == 200 and wc.open == 1 and len(accepted) == 2
        second.close()
        await wc.aclose()


async def test_a_caller_waiting_for_a_slot_gets_a_connection_put_back_into_the_pool() -> None:
    release = asyncio.Event()
    async with server(_one_stream_then_answers(release)) as (url, _):
        wc = client(max_connections=1, connect_timeout_s=0.3)
        held = await wc.post(url + "/x", {}, b"{}")
        waiting = asyncio.ensure_future(wc.post(url + "/x", {}, b"{}"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        release.set()
        assert await held.receive() == b""
        held.close()  # read to the end: back into the pool, idle, while a caller waits for a slot
        try:
            second = await waiting
        finally:
            await wc.aclose()
        assert second.status_code == 200
        second.close()


async def test_a_caller_cancelled_before_the_head_closes_its_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # never answers

    async with server(handler) as (url, _):
        wc = client()
        call = asyncio.ensure_future(wc.post(url + "/x", {}, b"{}"))
        await asyncio.sleep(0.05)
        assert wc.open == 1
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert wc.open == 0 and not any(wc.idle.values()), "closed, its slot freed, nothing pooled"
        await wc.aclose()


async def test_get_answers_a_wire_reply_of_any_status() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"content-length: 0\r\n" in head, "a GET says its empty body's length too"
            body = b'{"error": "warming up"}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async with server(handler) as (url, accepted):
        wc = client()
        for _ in range(2):
            reply = await wc.get(url + "/health", {}, 1.0)
            assert reply == WireReply(503, b'{"error": "warming up"}')
            assert reply.json() == {"error": "warming up"}
        assert len(accepted) == 1, "read whole: the connection is kept for the next poll"
        await wc.aclose()


# ---- TLS --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    authority = trustme.CA()
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    authority.cert_pem.write_to_path(str(path))
    return authority, path


async def test_https_is_verified_against_the_backends_own_ca(ca: tuple[trustme.CA, Path]) -> None:
    authority, ca_file = ca
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    srv = await asyncio.start_server(answer_all, "127.0.0.1", 0, ssl=context)
    port = srv.sockets[0].getsockname()[1]
    url = f"https://127.0.0.1:{port}/x"
    try:
        trusted = WireClient(1.0, 5.0, 3.0, 10, trust={("127.0.0.1", port): str(ca_file)})
        response = await trusted.post(url, {}, b"{}")
        assert response.status_code == 200 and await response.receive() == b"{}"
        response.close()
        assert (await trusted.get(url, {}, 1.0)).content == b"{}"
        assert trusted._tls("127.0.0.1", port) is trusted._tls("127.0.0.1", port), "one context per CA file"
        assert trusted._tls("127.0.0.1", port + 1) is not trusted._tls("127.0.0.1", port), "others: the system's"
        await trusted.aclose()
        system = WireClient(1.0, 5.0, 3.0, 10)  # the system's trust store does not know this CA
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await system.post(url, {}, b"{}")
        assert system.open == 0
        elsewhere = WireClient(1.0, 5.0, 3.0, 10, trust={("127.0.0.1", port + 1): str(ca_file)})
        with pytest.raises(httpx.ConnectError):  # trusted for another port only
            await elsewhere.post(url, {}, b"{}")
    finally:
        srv.close()
