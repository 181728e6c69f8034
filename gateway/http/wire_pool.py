"""The connection pool of the lean upstream client (gateway/http/wire.py): keep-alive connections per
(scheme, host, port) for ``keepalive_expiry_s``, a budget of open connections (a caller waits up to
the connect timeout for a slot: ``PoolTimeout``), ``post``, which sends a request and waits for the
response head, and ``get``, which reads a small answer whole (the backend pool's checks and polls,
on a client of their own). Errors are httpx's exception types.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from gateway.http.wire import WireResponse

GET_LIMIT = 4 << 20
"""The largest answer ``get`` reads (``/openapi.json`` is the biggest the pool asks for, ~100 KB)."""


@dataclass(frozen=True, slots=True)
class WireReply:
    """A whole answer to ``WireClient.get``: what the pool reads of httpx's ``Response``."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        return orjson.loads(self.content)


class WireClient:
    """Keep-alive connections per upstream, a connection budget, httpx's timeouts and exceptions."""

    def __init__(
        self,
        connect_timeout_s: float,
        idle_s: float,
        keepalive_expiry_s: float,
        max_connections: int,
        trust: Mapping[tuple[str, int], str] | None = None,
    ) -> None:
        """``trust``: (host, port) → a PEM file of the CAs that upstream's certificate is verified against
        (a backend's ``tls_ca_file``); every other ``https://`` upstream against the system's trust store."""
        self.connect_timeout_s, self.idle_s = connect_timeout_s, idle_s
        self.keepalive_expiry_s, self.max_connections = keepalive_expiry_s, max_connections
        self.idle: dict[tuple[str, str, int], deque[tuple[float, asyncio.Transport, WireResponse]]] = {}
        self.open = 0
        self._freed: deque[asyncio.Future[None]] = deque()
        self._ssl: ssl.SSLContext | None = None
        self._trust = dict(trust or {})
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._targets: dict[tuple[str, str], tuple[tuple[str, str, int], bytes]] = {}

    def put_back(self, conn: WireResponse) -> None:
        assert conn.transport is not None
        transport = conn.transport
        if conn.paused:
            transport.resume_reading()
        conn.transport, conn.parked = None, transport
        now = conn.loop.time()
        idle = self.idle.setdefault(conn.key, deque())
        while idle and (idle[0][1].is_closing() or now - idle[0][0] >= self.keepalive_expiry_s):
            idle.popleft()[1].close()  # the oldest went stale: free its socket and its slot now
            self.release()
        idle.append((now, transport, conn))
        self._wake_one()  # a caller waiting for a slot takes this connection, or its slot

    def _take_idle(self, key: tuple[str, str, int]) -> WireResponse | None:
        idle = self.idle.get(key)
        while idle:
            since, transport, conn = idle.pop()
            if transport.is_closing() or conn.loop.time() - since >= self.keepalive_expiry_s:
                transport.close()
                self.release()
                continue
            conn.reset()
            conn.transport = transport
            return conn
        return None

    def release(self) -> None:
        self.open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._freed:
            waiter = self._freed.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, key: tuple[str, str, int]) -> WireResponse | None:
        """A new connection to ``key`` within the budget; None when, while this waited for a slot, an
        idle connection to ``key`` came back (the caller takes that one instead)."""
        loop = asyncio.get_running_loop()
        while self.open >= self.max_connections:
            if self.idle.get(key):
                return None
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
        conn = WireResponse(self, key)
        tls = self._tls(host, port) if scheme == "https" else None
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: conn, host, port, ssl=tls),
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

    def _tls(self, host: str, port: int) -> ssl.SSLContext:
        """The TLS context for ``host:port``: its configured CAs, else the system's trust store (one
        context each, made on first use: loading a trust store costs milliseconds)."""
        ca_file = self._trust.get((host, port))
        if ca_file is None:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            return self._ssl
        context = self._contexts.get(ca_file)
        if context is None:
            context = self._contexts[ca_file] = ssl.create_default_context(cafile=ca_file)
        return context

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> WireResponse:
        """``send("POST", ...)`` (the request path calls ``send`` itself: a coroutine less)."""
        return await self.send("POST", url, headers, body)

    async def get(self, url: str, headers: dict[str, str], timeout_s: float) -> WireReply:
        """``GET url`` read whole (at most ``GET_LIMIT`` bytes) within ``timeout_s``, else
        ``httpx.ReadTimeout`` (the pool's health checks and load polls)."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self.send("GET", url, headers, b"")
                try:
                    parts: list[bytes] = []
                    size = 0
                    while chunk := await response.receive():
                        size += len(chunk)
                        if size > GET_LIMIT:
                            raise httpx.DecodingError(f"GET {url}: more than {GET_LIMIT} bytes")
                        parts.append(chunk)
                finally:
                    response.close()
        except TimeoutError:
            raise httpx.ReadTimeout(f"GET {url}: no whole answer in {timeout_s:g} s") from None
        return WireReply(response.status_code, b"".join(parts))

    async def send(self, method: str, url: str, headers: dict[str, str], body: bytes) -> WireResponse:
        """Send ``method url`` and wait for the response head; the body is read with ``receive``."""
        known = self._targets.get((method, url))
        if known is None:
            parts = urlsplit(url)
            scheme = parts.scheme
            port = parts.port or (443 if scheme == "https" else 80)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            known = self._targets[(method, url)] = (
                (scheme, parts.hostname or "", port),
                f"{method} {target} HTTP/1.1\r\nhost: {parts.netloc}\r\n".encode("latin-1"),
            )
        key, first = known
        lines = "".join([f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() not in ("host", "content-length")])
        request = b"%scontent-length: %d\r\n%s\r\n%s" % (first, len(body), lines.encode("latin-1"), body)
        while True:
            conn = self._take_idle(key)
            reused = conn is not None
            if conn is None:
                conn = await self._connect(key)
                if conn is None:
                    continue  # one of ours came back to the pool meanwhile: take it
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

    async def aclose(self) -> None:
        for idle in self.idle.values():
            for _, transport, _conn in idle:
                transport.close()
        self.idle.clear()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)
