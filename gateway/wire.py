"""A lean HTTP/1.1 client for the request path: one asyncio protocol per upstream connection.

Why not httpx here: relaying a stream through httpx → httpcore → h11 → anyio costs a cancel scope,
a timeout, a generator chain and an h11 event per chunk; measured (docs/benchmarks.md, "The
relay"), that was a third of a worker's time. Here a chunk is decoded in ``data_received`` and
handed to the one task waiting for it, or to a callback (``sink``: the callback relay,
gateway/relay.py, which can also ``hold`` reading while its client is slow). Per-stream timers
are re-armed lazily (one wake-up per silence, not one timer per chunk): the idle timeout
(``ReadTimeout``) and SSE keep-alive (``receive`` returns ``SILENCE``). Errors are httpx's
exception types, so callers and the failure classification (backends/failures.py) treat both
clients alike. httpx stays for everything else (health checks, load polls, on the pool's own
client).

Connections are pooled by ``WireClient`` (gateway/wire_pool.py); a response the caller did not read
to the end closes its connection (a client that leaves closes the upstream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from gateway.wire_pool import WireClient

SILENCE = b": keepalive\n\n"
_HIGH_WATER = 1 << 20


def _whole_frames(data: bytes) -> bytes:
    """The data of the chunk frames ``data`` is made of, joined, if it is nothing but whole frames of
    data (no last chunk, no extension), else b"" (the read then takes the general way)."""
    parts: list[bytes] = []
    pos, n = 0, len(data)
    while pos < n:
        i = data.find(b"\r\n", pos, pos + 10)
        if i < 0:
            return b""
        try:
            size = int(data[pos:i], 16)
        except ValueError:
            return b""
        end = i + 2 + size
        if not size or data[end : end + 2] != b"\r\n":
            return b""
        parts.append(data[i + 2 : end])
        pos = end + 2
    return b"".join(parts)


class WireResponse(asyncio.Protocol):
    """One connection and the response on it (status, headers, body decoded as it arrives)."""

    def __init__(
        self, client: WireClient, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.client, self.key = client, key
        self.loop = loop or asyncio.get_running_loop()
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
        self.held = False
        self.finished = False
        self.sink: Callable[[], None] | None = None
        """Called instead of waking ``receive``'s waiter (a callback relay takes the data itself)."""
        self.direct: Callable[[bytes, bytes], bool] | None = None
        """The callback relay's fast path: given a read that is exactly one whole chunk frame and its
        data (or b"" and the data of several whole frames), it relays the data and says True, or
        declines (False) and the read takes the general way (``out``, then ``sink``)."""

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
        self.last_rx = self.loop.time()
        direct = self.direct
        if direct is not None and not (self.raw or self.skip or self.chunk_left or self.out):
            # The steady state of a relayed stream: one read, one chunk frame ``<hex>\r\n<data>\r\n``
            # (the size line exactly the canonical lower-case hex of the data's length: no extension).
            i = data.find(b"\r\n")
            size = len(data) - i - 4
            if size > 0 and data[:i] == b"%x" % size and data.endswith(b"\r\n"):
                if direct(data, data[i + 2 : -2]):
                    return
            else:  # several whole frames that piled up while the worker was busy: their data in one
                body = _whole_frames(data)
                if body and direct(b"", body):
                    return
        self.received = True
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
        if self.pending > _HIGH_WATER and not self.paused:
            self._flow()
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

    def _flow(self) -> None:
        """Upstream reading paused while held (the client is slow) or while too much waits unread."""
        want = self.held or self.pending > _HIGH_WATER
        if want != self.paused and self.transport is not None:
            self.paused = want
            if want:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def hold(self, on: bool) -> None:
        """Pause (or resume) reading from upstream: the client is not taking what it gets."""
        self.held = on
        self._flow()

    def _wake(self) -> None:
        if self.sink is not None:
            self.sink()
            return
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

    def take(self) -> bytes | None:
        """``receive`` without waiting: None when nothing is there yet."""
        if self.out:
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.out.clear()
            self.pending = 0
            if self.paused:
                self._flow()
            return data
        if self.error is not None:
            raise self.error
        if self.done:
            return b""
        if self.keepalive_s and self.loop.time() - max(self.last_rx, self.last_signal) >= self.keepalive_s:
            self.last_signal = self.loop.time()
            return SILENCE
        return None

    async def receive(self) -> bytes:
        """The body bytes that arrived since the last call (b"" at the end), or ``SILENCE``."""
        while True:
            data = self.take()
            if data is not None:
                return data
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

    def body_now(self, limit: int) -> bytes | None:
        """The whole body when all of it has arrived (at most ``limit`` bytes), without waiting;
        else None (``gateway/proxy.py``'s ``read_body`` waits for it)."""
        if not self.done or self.error is not None:
            return None
        if self.pending > limit:  # the bytes waiting in ``out``
            return None
        return self.take() or b""

    async def aclose(self) -> None:
        """``close`` for callers that await (httpx's name)."""
        self.close()

    def close(self) -> None:
        """Done with the response: the connection goes back to the pool if it was read to the end,
        else it is closed (the upstream sees the client leave) and its slot of the budget freed."""
        if self.finished:
            return
        self.finished = True
        self.sink = self.direct = None
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
        # The same loop: asyncio.get_running_loop() checks the pid (a getpid syscall) on every call.
        self.__init__(self.client, self.key, self.loop)  # type: ignore[misc]
