"""A lean HTTP/1.1 client to the backends: one asyncio protocol per upstream connection, its
responses parsed by llhttp (``httptools.HttpResponseParser``, the parser uvicorn runs on requests).
Under ``cachegate serve`` the request path goes through it, and so do the backend pool's health checks,
self-description reads and load polls (on a ``WireClient`` of their own, gateway/worker.py); a pool made
outside the gateway (tests, tools) runs them on httpx (backends/pool.py).

Why not httpx here: relaying a stream through httpx → httpcore → h11 → anyio costs a cancel scope,
a timeout, a generator chain and an h11 event per chunk (the relay's cost as it is now:
docs/benchmarks.md, "The relay at scale"). Here
llhttp's callbacks decode a read in ``data_received`` and hand the data to the one task waiting for
it, or to a callback (``sink``: the callback relay, gateway/relay/events.py, which can also ``hold``
reading while its client is slow). Per-stream timers are re-armed lazily (one wake-up per silence,
not one timer per chunk): the idle timeout (``ReadTimeout``) and SSE keep-alive (``receive``
returns ``SILENCE``). Errors are httpx's exception types, so callers and the failure classification
(backends/failures.py) treat both clients alike; a response llhttp rejects is ``UpstreamMalformed``.

What a hostile or broken upstream cannot do (tests/gateway/test_wire_hostile.py):
- stall the worker or grow its memory: llhttp rejects bad framing at the byte; a head is capped at
  ``HEAD_LIMIT``, one chunk at ``CHUNK_LIMIT``;
- hand a request bytes that are not its response's: a chunk's data is released only once its
  closing CRLF has been parsed; a connection goes back to the pool only if its response ended
  exactly where llhttp says and nothing followed; a byte that arrives on an idle pooled connection
  closes it;
- pass an interim answer for the answer: 1xx responses are skipped.

The steady state of a relayed stream skips llhttp: a read that is exactly one canonical chunk frame,
while llhttp sits at a chunk's start with nothing buffered, goes to the relay as it came (what llhttp
would call back, byte for byte; its callbacks per chunk would cost the relay more CPU: docs/benchmarks.md,
"The upstream parser: llhttp against the hand-written one").

Connections are pooled by ``WireClient`` (gateway/http/wire_pool.py); a response the caller did not read
to the end closes its connection (a client that leaves closes the upstream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import httptools
import httpx

if TYPE_CHECKING:
    from gateway.http.wire_pool import WireClient

SILENCE = b": keepalive\n\n"
_HIGH_WATER = 1 << 20
HEAD_LIMIT = 64 << 10
"""The largest response head read (status line and headers; h11's default is 16 KiB)."""
CHUNK_LIMIT = 16 << 20
"""The largest chunk of a chunked body: its data is held until its CRLF is parsed."""


class UpstreamMalformed(httpx.RemoteProtocolError):
    """The upstream's bytes are not a valid HTTP/1.1 response (llhttp's reason in the message)."""


class _Stop(Exception):
    """Raised in a parser callback to stop parsing (the reason is already in ``error``)."""


class WireResponse(asyncio.Protocol):
    """One connection and the response on it (status, headers, body decoded as it arrives)."""

    def __init__(
        self, client: WireClient, key: tuple[str, str, int], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.client, self.key = client, key
        self.loop = loop or asyncio.get_running_loop()
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.parked: asyncio.Transport | None = None
        """The transport while the connection idles in the pool (``transport`` is None then)."""
        self.status_code = 0
        self.headers: dict[str, str] = {}
        """Lower-case names; a repeated header keeps its last value (none the gateway reads repeats)."""
        self.out: list[bytes] = []
        self.pending = 0
        self.part: list[bytes] = []
        self.part_size = 0
        self.head_size = 0
        self.boundary = False
        """llhttp sits at the start of a chunk with nothing of the next one buffered: its last callback
        ended a chunk (or a chunked head) and the read that brought it ended there."""
        self.ended = False
        self.head_done = False
        self.interim = False
        self.done = False
        self.chunked = False
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
        """The callback relay's fast path: given a read that was exactly one whole chunk frame and its
        data (or b"" and the data of the whole chunks a read completed), it relays the data and says
        True, or declines (False) and the data takes the general way (``out``, then ``sink``)."""

    # ----- llhttp's callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer (100 Continue, 103 Early Hints); the real one follows
            self.interim, self.headers = True, {}
            return
        self.status_code = status
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        self.reusable = self.parser.should_keep_alive()
        self.head_done = self.ended = True

    def on_body(self, body: bytes) -> None:
        if not self.chunked:
            self.out.append(body)
            self.pending += len(body)
            return
        self.part_size += len(body)
        if self.part_size > CHUNK_LIMIT:
            self._malformed(f"a chunk of more than {CHUNK_LIMIT} bytes")
        self.part.append(body)

    def on_chunk_header(self) -> None:
        self.ended = False

    def on_chunk_complete(self) -> None:
        self.ended = True
        if self.part:
            data = self.part[0] if len(self.part) == 1 else b"".join(self.part)
            self.part, self.part_size = [], 0
            self.out.append(data)
            self.pending += len(data)

    def on_message_begin(self) -> None:
        if self.done:  # a second response on the connection before any request asked for it
            self.reusable = False
            raise _Stop

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.done = True

    def _malformed(self, reason: str) -> None:
        self.error = self.error or UpstreamMalformed(f"malformed response from upstream: {reason}")
        raise _Stop

    # ----- the transport's callbacks ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = self.parked = None
        if not self.done and self.error is None:
            te_or_length = self.chunked or "content-length" in self.headers
            if self.head_done and not te_or_length and exc is None:
                self.done = True  # body delimited by the close (llhttp waits for the EOF to say so)
            else:
                self.error = httpx.RemoteProtocolError("the upstream closed the connection mid-response")
        self._wake()

    def data_received(self, data: bytes) -> None:
        self.last_rx = self.loop.time()
        if self.parked is not None:  # nothing may arrive on an idle connection: it is not ours to read
            self.parked.close()
            return
        if self.done or self.error is not None:
            self.reusable = False  # bytes past the end of the response: the connection is not reused
            return
        self.received = True
        direct = self.direct
        if direct is not None and self.boundary and self.chunked and not self.out:
            # The steady state of a relayed stream: a read that is exactly one chunk frame
            # ``<hex>\r\n<data>\r\n`` (the size line the canonical lower-case hex of the data's
            # length) while llhttp sits at a chunk's start. llhttp would call back exactly this data
            # and end where it began, so the read is relayed without it (tests/gateway/test_wire_framing.py
            # checks that both ways give the same bytes).
            i = data.find(b"\r\n")
            size = len(data) - i - 4
            if size > 0 and data[:i] == b"%x" % size and data.endswith(b"\r\n") and direct(data, data[i + 2 : -2]):
                return
        fresh, head_was = not self.out and not self.part, self.head_done
        self.ended = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.error = self.error or UpstreamMalformed("malformed response from upstream: a protocol switch")
        except httptools.HttpParserError as exc:
            if self.done:
                self.reusable = False  # whatever followed a complete response
            elif self.error is None:  # (a callback that stopped the parser set its own reason)
                self.error = UpstreamMalformed(f"malformed response from upstream: {exc}")
        if not self.head_done and self.error is None:
            self.head_size += len(data)
            if self.head_size > HEAD_LIMIT:
                self.error = UpstreamMalformed(f"malformed response from upstream: a head over {HEAD_LIMIT} bytes")
        self.boundary = self.ended and data.endswith(b"\r\n") and self.error is None
        if self.error is not None:
            self.reusable = False
            if self.transport is not None:
                self.transport.close()  # never reused; nothing more is read from it
        out = self.out
        if out and fresh and self.direct is not None and self.error is None:
            body = out[0] if len(out) == 1 else b"".join(out)
            # A read that is exactly one canonical chunk frame goes to the relay with that frame,
            # which it may forward as it came (the length check first: it rules out most reads).
            hexlen = b"%x" % len(body)
            one = (
                len(out) == 1 and len(data) == len(body) + len(hexlen) + 4 and data == b"%s\r\n%s\r\n" % (hexlen, body)
            )
            if self.direct(data if one else b"", body):
                out.clear()
                self.pending = 0
                if not self.done:
                    return
        elif not out and not self.done and self.error is None and head_was == self.head_done:
            return  # nothing new for the reader (a chunk or the head still arriving)
        if self.pending > _HIGH_WATER and not self.paused:
            self._flow()
        self._wake()

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

    async def readable(self) -> None:
        """Wait until body bytes, the end or an error are there, taking nothing (the PD hop's gate:
        gateway/request/pd_hop.py)."""
        while not self.out and not self.done and self.error is None:
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def body_now(self, limit: int) -> bytes | None:
        """The whole body when all of it has arrived (at most ``limit`` bytes), without waiting;
        else None (``gateway/relay/proxy.py``'s ``read_body`` waits for it)."""
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
        if self.transport is not None and self.done and self.reusable and not self.out and self.error is None:
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
