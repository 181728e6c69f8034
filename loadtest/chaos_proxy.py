"""A fault-injecting HTTP/1.1 proxy in front of one twin, which also measures in-flight work per team.

It sits at the twin's door: the gateway's backend URL is the proxy's. Each POST it forwards counts
as in flight for the team named in the body's ``user`` field (the chaos load puts its team there;
the gateway passes it through untouched) from the moment it is sent to the twin until its response
has been relayed whole or either side closed (a reset counts as a close: ``gone``), so ``peak`` is
the most requests of a team the backend ever had at once. Modes: ``ok`` (relay), ``5xx`` (answer
POSTs 503 at once, as an engine in trouble), ``hang`` (read every request, answer nothing until the
mode changes: a hung engine, health checks included). Raw asyncio with minimal parsing (Content-Length
bodies, chunked or sized responses).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable

_USER = re.compile(rb'"user"\s*:\s*"([^"]{1,64})"')


class Meter:
    """In-flight requests per team summed over every proxy (all the backends), and the peak.

    A request whose gateway connection has already closed (EOF or reset received, not yet handled by
    this loop) is not counted in a peak: under CPU starvation this process may notice the close later
    than the gateway's next request arrives."""

    def __init__(self) -> None:
        self.inflight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.forwarded = 0
        self._open: dict[str, dict[int, asyncio.StreamReader]] = {}

    def live(self, team: str) -> int:
        return sum(1 for r in self._open.get(team, {}).values() if not gone(r))

    def begin(self, team: str, client: asyncio.StreamReader) -> None:
        self.inflight[team] = self.inflight.get(team, 0) + 1
        self._open.setdefault(team, {})[id(client)] = client
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
                if team is not None:
                    self.meter.begin(team, reader)
                try:
                    upstream[1].write(head + body)
                    await upstream[1].drain()
                    done = (lambda t=team: self.meter.end(t, reader)) if team is not None else (lambda: None)
                    keep = await _relay_or_leave(upstream[0], reader, writer, done)
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
    up: asyncio.StreamReader, client: asyncio.StreamReader, down: asyncio.StreamWriter, done: Callable[[], None]
) -> bool:
    """Relay one response unless the client (the gateway) closes first: then False (close both).
    EOF is watched without reading, so no byte of a next request is ever taken."""
    relay = asyncio.create_task(_relay_response(up, down, done))
    gone = asyncio.create_task(_until_eof(client))
    try:
        done, _ = await asyncio.wait({relay, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relay, gone):
            if not task.done():
                task.cancel()
        await asyncio.gather(relay, gone, return_exceptions=True)
    if relay in done and not relay.cancelled() and relay.exception() is None:
        return relay.result()
    return False


def gone(reader: asyncio.StreamReader) -> bool:
    """The gateway closed this connection: a FIN (EOF), or a reset. The gateway closes the upstream
    connection of a request whose client left; with response bytes still unread in its socket, Linux
    sends RST for that close, which sets the reader's exception and never its EOF (counting only EOF
    kept such a request in flight until the engine's next byte: peaks of 5 against a limit of 4)."""
    return reader.at_eof() or reader.exception() is not None


async def _until_eof(reader: asyncio.StreamReader) -> None:
    while not gone(reader):
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
