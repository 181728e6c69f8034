"""The chaos suite's fault proxy counts a request in flight at the backend's door only while the
gateway's connection is open: a connection the gateway resets (RST: it closed it with response
bytes unread, as when its client left mid-stream) ends the request at once and closes the backend's
connection (the engine aborts it), and is never counted in a later peak; nor is one whose request
and close arrived together while the proxy's loop was busy. Real sockets on loopback: a slow
streaming upstream, the proxy, raw client sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time

from backends.sim.testing import free_port
from loadtest.chaos.proxy import FaultProxy, Meter

BODY = b'{"model":"m","user":"a","stream":true}'
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def _slow_stream(closed: list[float], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine that streams a first chunk, then computes 10 s in silence (a long decode step, a
    queue): only the client's own close can end the request early."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for pause in (0.0, 10.0):
            with contextlib.suppress(TimeoutError):
                if pause and not await asyncio.wait_for(reader.read(1), pause):
                    return  # its client (the proxy) closed: aborted
            data = b"data: " + b"x" * 1024 + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        closed.append(time.monotonic())
        writer.close()


async def _client(port: int) -> socket.socket:
    """A gateway connection that sent one request and has the response's first bytes."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, REQUEST)
    await loop.sock_recv(sock, 100)
    await asyncio.sleep(0.3)  # the rest of the first chunk arrives, left unread
    return sock


def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST, not FIN


async def _until(pred: object, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():  # type: ignore[operator]
            return time.monotonic() - t0
        await asyncio.sleep(0.01)
    return None


def test_a_reset_gateway_connection_ends_the_request_and_the_engines() -> None:
    async def main() -> None:
        closed: list[float] = []
        upstream = await asyncio.start_server(lambda r, w: _slow_stream(closed, r, w), "127.0.0.1", 0)
        meter = Meter()
        proxy = FaultProxy(upstream.sockets[0].getsockname()[1], free_port(), meter)
        await proxy.start()
        try:
            first = await _client(proxy.port)
            assert meter.inflight == {"a": 1} and meter.live("a") == 1
            _reset(first)
            # the engine is silent for 10 s: the proxy must see the reset itself, not at the next chunk
            took = await _until(lambda: meter.inflight["a"] == 0 and closed, 3.0)
            assert took is not None, (meter.inflight, closed)
            meter.reset_peaks()
            second = await _client(proxy.port)
            assert meter.peak["a"] == 1 and meter.live("a") == 1  # the reset request is not counted
            second.close()  # FIN, with unread bytes: Linux resets it too
            assert await _until(lambda: meter.inflight["a"] == 0 and len(closed) == 2, 3.0) is not None
        finally:
            await proxy.stop()
            upstream.close()
            await upstream.wait_closed()

    asyncio.run(main())


async def _quick(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine that answers each request at once (keep-alive)."""
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
    writer.close()


def _idle_connection(port: int) -> socket.socket:
    """A gateway connection that has had one answer: idle at the proxy, which waits for its next request."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(REQUEST)
    got = b""
    while not got.endswith(b"{}"):
        got += sock.recv(1024)
    return sock


def test_a_close_that_arrived_with_its_request_during_a_stall_is_not_counted() -> None:
    """While the proxy's loop is blocked, one idle gateway connection sends a request and closes (its
    client left at once) and another sends a request: the loop reads both requests in one pass and
    the first's FIN only in a later one. The peak is 1, not 2."""

    async def main() -> None:
        upstream = await asyncio.start_server(_quick, "127.0.0.1", 0)
        meter = Meter()
        proxy = FaultProxy(upstream.sockets[0].getsockname()[1], free_port(), meter)
        await proxy.start()
        loop = asyncio.get_running_loop()
        try:
            for _ in range(3):
                left, other = await asyncio.gather(
                    loop.run_in_executor(None, _idle_connection, proxy.port),
                    loop.run_in_executor(None, _idle_connection, proxy.port),
                )
                assert await _until(lambda: meter.inflight.get("a") == 0, 3.0) is not None
                meter.reset_peaks()
                left.sendall(REQUEST)
                left.close()  # FIN right behind the request
                other.sendall(REQUEST)
                time.sleep(0.05)  # the proxy's loop is busy (blocked on purpose)
                await asyncio.sleep(0.2)
                assert meter.peak["a"] == 1, meter.peak
                other.close()
        finally:
            await proxy.stop()
            upstream.close()
            await upstream.wait_closed()

    asyncio.run(main())
