"""A lean HTTP/1.1 client for the request path: one asyncio protocol per upstream connection.

Why not httpx here: relaying a stream through httpx → httpcore → h11 → anyio costs a cancel scope,
a timeout, a generator chain and an h11 event per chunk; measured (docs/benchmarks.md, "The
relay"), that was a third of a worker's time. Here a chunk is decoded in ``data_received`` and
handed to the one task waiting for it. Per-stream timers are re-armed lazily (one wake-up per
silence, not one timer per chunk): the idle timeout (``ReadTimeout``) and SSE keep-alive
(``receive`` returns ``SILENCE``). Errors are httpx's exception types, so callers and the failure
classification (backends/failures.py) treat both clients alike. httpx stays for everything else
(health checks, load polls, on the pool's own client).

Connections are kept alive per (scheme, host, port) for ``keepalive_expiry_s``; a response the
caller did not read to the end closes its connection (a client that leaves closes the upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

SILENCE = b": keepalive\n\n"
_HIGH_WATER = 1 << 20


class WireResponse(asyncio.Protocol):
    """One connection and the response on it (status, headers, body decoded as it arrives)."""

    def __init__(self, client: WireClient, key: tuple[str, str, int]) -> None:
        self.client, self.key = client, key
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.status_code = 0
        self.headers: dict[str, str] = {}
        """Lower-case names; a repeated header keeps its last value (none the gateway reads repeats)."""
        self.raw = b""
        self.out: list[bytes] = []
        self.pending = 0
        self.head_done = False
        self.done = False
        self.chunked = False
        self.length = -1
        self.chunk_left = 0
        self.skip = 0
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.last_rx = self.loop.time()
        self.idle_s = client.idle_s
        self.keepalive_s = 0.0
        self.last_signal = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.received = False
        self.reusable = False
        self.paused = False
        self.finished = False

    # ----- protocol callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.done and self.error is None:
            if self.head_done and not self.chunked and self.length < 0:
                self.done = True  # body delimited by the close
            else:
                self.error = httpx.RemoteProtocolError("the upstream closed the connection mid-response")
        self._wake()

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.last_rx = self.loop.time()
        raw = self.raw + data if self.raw else data
        if not self.head_done:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                self.raw = raw
                return
            self._head(raw[:end])
            if self.error is not None:
                self._wake()
                return
            raw = raw[end + 4 :]
            if self.length == 0:
                self.done = True
        if self.chunked:
            self.raw = self._dechunk(raw)
        else:
            self.raw = b""
            if self.length >= 0:
                raw = raw[: self.length]
                self.length -= len(raw)
            if raw:
                self.out.append(raw)
                self.pending += len(raw)
            if self.length == 0:
                self.done = True
        if self.pending > _HIGH_WATER and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            self.error = httpx.RemoteProtocolError("malformed upstream status line")
            return
        self.status_code = int(parts[1])
        self.headers = {
            k.strip().lower().decode("latin-1"): v.strip().decode("latin-1")
            for k, _, v in (ln.partition(b":") for ln in lines[1:])
        }
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        self.length = int(length) if length and length.isdigit() and not self.chunked else -1
        if self.status_code in (204, 304):
            self.length, self.chunked = 0, False
        self.reusable = (
            parts[0] == b"HTTP/1.1"
            and self.headers.get("connection", "").lower() != "close"
            and (self.chunked or self.length >= 0)
        )
        self.head_done = True

    def _dechunk(self, raw: bytes) -> bytes:
        pos, n = 0, len(raw)
        while pos < n:
            if self.skip:  # the CRLF after a chunk's data
                k = min(self.skip, n - pos)
                pos += k
                self.skip -= k
                continue
            if self.chunk_left:
                take = min(self.chunk_left, n - pos)
                self.out.append(raw[pos : pos + take])
                self.pending += take
                pos += take
                self.chunk_left -= take
                if not self.chunk_left:
                    self.skip = 2
                continue
            end = raw.find(b"\r\n", pos)
            if end < 0:
                break
            try:
                size = int(raw[pos:end].split(b";", 1)[0], 16)
            except ValueError:
                self.error = httpx.RemoteProtocolError("malformed chunk size from upstream")
                return b""
            if size == 0:
                if raw.find(b"\r\n", end + 2) < 0:
                    break  # wait for the end of the trailers
                self.done = True
                return b""
            pos = end + 2
            self.chunk_left = size
        return raw[pos:]

    # ----- the caller's side --------------------------------------------------------------------

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _arm(self) -> None:
        due = self.last_rx + self.idle_s
        if self.keepalive_s:
            due = min(due, max(self.last_rx, self.last_signal) + self.keepalive_s)
        self.timer = self.loop.call_at(due, self._check)

    def _check(self) -> None:
        if self.done or self.finished:
            return
        now = self.loop.time()
        if now - self.last_rx >= self.idle_s:
            self.error = self.error or httpx.ReadTimeout("the upstream went silent for too long")
            self._wake()
            return
        if self.keepalive_s and now - max(self.last_rx, self.last_signal) >= self.keepalive_s:
            self._wake()  # receive() returns SILENCE; look again one keep-alive period from now
            self.timer = self.loop.call_at(min(self.last_rx + self.idle_s, now + self.keepalive_s), self._check)
            return
        self._arm()

    def watch_silence(self, keepalive_s: float) -> None:
        """From now on ``receive`` returns ``SILENCE`` after each ``keepalive_s`` without data."""
        self.keepalive_s = keepalive_s
        self.last_signal = self.loop.time()
        if self.timer is not None:
            self.timer.cancel()
        self._arm()

    async def receive(self) -> bytes:
        """The body bytes that arrived since the last call (b"" at the end), or ``SILENCE``."""
        while True:
            if self.out:
                data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
                self.out.clear()
                self.pending = 0
                if self.paused and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                return data
            if self.error is not None:
                raise self.error
            if self.done:
                return b""
            if self.keepalive_s and self.loop.time() - max(self.last_rx, self.last_signal) >= self.keepalive_s:
                self.last_signal = self.loop.time()
                return SILENCE
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    async def aiter_raw(self) -> AsyncIterator[bytes]:  # httpx.Response's name, for read_body
        while True:
            data = await self.receive()
            if data is SILENCE:
                continue
            if not data:
                return
            yield data

    async def _until_head(self) -> None:
        while not self.head_done and self.error is None:
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        """Done with the response: the connection goes back to the pool if it was read to the end,
        else it is closed (the upstream sees the client leave) and its slot of the budget freed."""
        if self.finished:
            return
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if (
            self.transport is not None
            and self.done
            and self.reusable
            and not self.out
            and self.error is None
            and not self.raw
        ):
            self.client.put_back(self)
            return
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.client.release()

    def reset(self) -> None:
        """Ready for the next request on the same connection."""
        self.__init__(self.client, self.key)  # type: ignore[misc]


class WireClient:
    """Keep-alive connections per upstream, a connection budget, httpx's timeouts and exceptions."""

    def __init__(
        self, connect_timeout_s: float, idle_s: float, keepalive_expiry_s: float, max_connections: int
    ) -> None:
        self.connect_timeout_s, self.idle_s = connect_timeout_s, idle_s
        self.keepalive_expiry_s, self.max_connections = keepalive_expiry_s, max_connections
        self.idle: dict[tuple[str, str, int], deque[tuple[float, asyncio.Transport, WireResponse]]] = {}
        self.open = 0
        self._freed: deque[asyncio.Future[None]] = deque()
        self._ssl: ssl.SSLContext | None = None
        self._targets: dict[str, tuple[tuple[str, str, int], bytes]] = {}

    def put_back(self, conn: WireResponse) -> None:
        assert conn.transport is not None
        transport = conn.transport
        conn.transport = None
        now = conn.loop.time()
        idle = self.idle.setdefault(conn.key, deque())
        while idle and (idle[0][1].is_closing() or now - idle[0][0] >= self.keepalive_expiry_s):
            idle.popleft()[1].close()  # the oldest went stale: free its socket and its slot now
            self.release()
        idle.append((now, transport, conn))

    def _take_idle(self, key: tuple[str, str, int]) -> WireResponse | None:
        idle = self.idle.get(key)
        loop = asyncio.get_running_loop()
        while idle:
            since, transport, conn = idle.pop()
            if transport.is_closing() or loop.time() - since >= self.keepalive_expiry_s:
                transport.close()
                self.release()
                continue
            conn.reset()
            conn.transport = transport
            return conn
        return None

    def release(self) -> None:
        self.open -= 1
        while self._freed:
            waiter = self._freed.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, key: tuple[str, str, int]) -> WireResponse:
        loop = asyncio.get_running_loop()
        while self.open >= self.max_connections:
            oldest = min((q for q in self.idle.values() if q), key=lambda q: q[0][0], default=None)
            if oldest is not None:  # an idle connection (to any upstream) gives its slot up
                oldest.popleft()[1].close()
                self.release()
                break
            waiter: asyncio.Future[None] = loop.create_future()
            self._freed.append(waiter)
            try:
                await asyncio.wait_for(waiter, self.connect_timeout_s)
            except TimeoutError:
                raise httpx.PoolTimeout("no upstream connection free in time") from None
        self.open += 1
        scheme, host, port = key
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        conn = WireResponse(self, key)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: conn, host, port, ssl=self._ssl if scheme == "https" else None),
                self.connect_timeout_s,
            )
        except TimeoutError:
            self.release()
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} in time") from None
        except OSError as exc:
            self.release()
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.release()
            raise
        return conn

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> WireResponse:
        """Send ``POST url`` and wait for the response head; the body is read with ``receive``."""
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            scheme = parts.scheme
            port = parts.port or (443 if scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            known = self._targets[url] = (
                (scheme, parts.hostname or "", port),
                f"POST {target} HTTP/1.1\r\nhost: {parts.netloc}\r\n".encode("latin-1"),
            )
        key, first = known
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length"))
        request = b"%scontent-length: %d\r\n%s\r\n%s" % (first, len(body), lines.encode("latin-1"), body)
        for reused in (True, False):
            conn = self._take_idle(key) if reused else await self._connect(key)
            if conn is None:
                continue
            conn.transport.write(request)  # type: ignore[union-attr]
            conn._arm()
            try:
                await conn._until_head()
            except httpx.RemoteProtocolError:
                await conn.aclose()
                if reused and not conn.received:
                    continue  # the server had closed the idle connection: once more on a new one
                raise
            except BaseException:
                await conn.aclose()
                raise
            return conn
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        for idle in self.idle.values():
            for _, transport, _conn in idle:
                transport.close()
        self.idle.clear()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)
