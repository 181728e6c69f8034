"""A fault-injecting HTTP/1.1 proxy in front of one twin, which also measures in-flight work per team.

It sits at the twin's door: the gateway's backend URL is the proxy's. Each POST it forwards counts
as in flight for the team named in the body's ``user`` field (the chaos load puts its team there;
the gateway passes it through untouched) from the moment it is sent to the twin until its response
has been relayed whole or either side closed (``gone``: a FIN or a reset, seen or pending), so ``peak`` is
the most requests of a team the backend ever had at once. Modes: ``ok`` (relay), ``5xx`` (answer
POSTs 503 at once, as an engine in trouble), ``hang`` (read every request, answer nothing until the
mode changes: a hung engine, health checks included). Raw asyncio with minimal parsing (Content-Length
bodies, chunked or sized responses).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
from collections.abc import Callable
from typing import Any

_USER = re.compile(rb'"user"\s*:\s*"([^"]{1,64})"')


class Meter:
    """In-flight requests per team summed over every proxy (all the backends), and the peak.

    A request whose gateway connection has already closed (``gone``: a FIN or a reset, handled by this
    loop or still in the kernel) is not counted in a peak: under CPU starvation this process may
    handle the close later than the gateway's next request."""

    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.forwarded = 0
        self._open: dict[str, dict[int, tuple[asyncio.StreamReader, Any]]] = {}

    def live(self, team: str) -> int:
        return sum(1 for r, sock in self._open.get(team, {}).values() if not gone(r, sock))

    def begin(self, team: str, client: asyncio.StreamReader, sock: Any = None) -> None:
        """``sock``: the gateway connection's socket (``get_extra_info("socket")``), looked at for a
        close that this loop has not handled yet."""
        self.inflight[team] = self.inflight.get(team, 0) + 1
        self._open.setdefault(team, {})[id(client)] = (client, sock)
        self.peak[team] = max(self.peak.get(team, 0), self.live(team))
        self.forwarded += 1

    def end(self, team: str, client: asyncio.StreamReader) -> None:
        """Once per request (later calls do nothing)."""
        if self._open.get(team, {}).pop(id(client), None) is not None:
            self.inflight[team] -= 1

    def reset_peaks(self) -> None:
        self.peak = {team: self.live(team) for team in self.inflight}


class FaultProxy:
    def __init__(self, upstream_port: int, port: int, meter: Meter) -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.mode = "ok"
        self.meter = meter
        self.server: asyncio.Server | None = None
        self._resume = asyncio.Event()
        self._resume.set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        if mode == "hang":
            self._resume.clear()
        else:
            self._resume.set()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", self.port, limit=1 << 20, backlog=1024)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self._resume.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = _header_int(head, b"content-length")
                body = await reader.readexactly(length) if length else b""
                if self.mode == "hang":
                    await self._resume.wait()
                if self.mode == "5xx" and head.startswith(b"POST"):
                    payload = b'{"object":"error","message":"injected 5xx","type":"InternalServerError","code":503}'
                    writer.write(
                        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
                    )
                    await writer.drain()
                    continue
                if upstream is None:
                    upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port, limit=1 << 20)
                team = _team(body) if head.startswith(b"POST") else None
                sock = writer.get_extra_info("socket")
                if team is not None:
                    self.meter.begin(team, reader, sock)
                try:
                    upstream[1].write(head + body)
                    await upstream[1].drain()
                    done = (lambda t=team: self.meter.end(t, reader)) if team is not None else (lambda: None)
                    keep = await _relay_or_leave(upstream[0], reader, sock, writer, done)
                finally:
                    if team is not None:
                        self.meter.end(team, reader)
                if not keep:
                    return  # closes the twin's connection too: the twin aborts the request
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            OSError,
            asyncio.CancelledError,
        ):  # CancelledError: the run is over
            return
        finally:
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()


def _team(body: bytes) -> str:
    match = _USER.search(body[:4096]) or _USER.search(body[-4096:])
    return match.group(1).decode(errors="replace") if match else "?"


def _header_int(head: bytes, name: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return int(value.strip() or 0)
    return 0


async def _relay_or_leave(
    up: asyncio.StreamReader,
    client: asyncio.StreamReader,
    sock: Any,
    down: asyncio.StreamWriter,
    done: Callable[[], None],
) -> bool:
    """Relay one response unless the client (the gateway) closes first: then False (close both).
    EOF is watched without reading, so no byte of a next request is ever taken."""
    relay = asyncio.create_task(_relay_response(up, down, done))
    left = asyncio.create_task(_until_eof(client, sock))
    try:
        done, _ = await asyncio.wait({relay, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relay, left):
            if not task.done():
                task.cancel()
        await asyncio.gather(relay, left, return_exceptions=True)
    if relay in done and not relay.cancelled() and relay.exception() is None:
        return relay.result()
    return False


def gone(reader: asyncio.StreamReader, sock: Any = None) -> bool:
    """The gateway closed this connection (its client left): a FIN or a reset, handled by this loop
    or still waiting in the kernel.

    Both were once counted in flight, giving peaks of 5 against a limit of 4 when this process was
    busy (oversized bodies): a reset (the gateway closed with response bytes unread: Linux sends RST)
    sets the reader's exception, never its EOF; and after a stall the request's bytes and its FIN
    arrive together, the loop reads the bytes in one pass and the FIN only in a later one, after
    the next request has been counted. ``poll`` asks the kernel (Linux: POLLRDHUP for a FIN;
    POLLERR and POLLHUP, always reported, for a reset) without reading."""
    if reader.at_eof() or reader.exception() is not None:
        return True
    if sock is None:
        return False
    fd = sock.fileno()
    if fd < 0:  # closed by this side
        return True
    poll = select.poll()
    poll.register(fd, select.POLLRDHUP)
    return bool(poll.poll(0))


async def _until_eof(reader: asyncio.StreamReader, sock: Any) -> None:
    while not gone(reader, sock):
        await asyncio.sleep(0.02)


async def _relay_response(up: asyncio.StreamReader, down: asyncio.StreamWriter, done: Callable[[], None]) -> bool:
    """Relay one response; False when the connection must close after it. ``done`` is called the moment
    the twin's last byte (or a stream's ``[DONE]`` event, after which the gateway may release the
    request) is handed on, before any other task runs."""
    head = await up.readuntil(b"\r\n\r\n")
    down.write(head)
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        while True:
            line = await up.readuntil(b"\r\n")
            size = int(line.split(b";")[0].strip() or b"0", 16)
            data = await up.readexactly(size + 2)
            down.write(line + data)
            if size == 0 or b"data: [DONE]" in data:  # the engine has finished with the request
                done()
            if size == 0:
                break
            await down.drain()
    else:
        length = _header_int(head, b"content-length")
        if length:
            down.write(await up.readexactly(length))
        done()
    await down.drain()
    return b"connection: close" not in lower
