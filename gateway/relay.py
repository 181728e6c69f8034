"""The SSE relay: upstream bytes to the client, whole events, as they arrive, with as little work
per chunk as the contract allows. Every relay of every surface runs on this one loop
(``relay_events``); what differs per surface is an ``SseFilter``.

Per read from upstream: one byte scan for event boundaries, the filter over the whole events that
arrived, and one ``send`` for everything that came together (events that came in one read, or piled
up while the worker was busy, go out in one write: under load the relay coalesces instead of
falling behind). No task, lock or timeout object per chunk: keep-alive comments and the idle
timeout come from the connection's one lazily re-armed timer (gateway/wire.py).

The base ``SseFilter`` is chat's byte-exact passthrough: a byte check per event (after the first
token, a chunk with ``"finish_reason":null`` and ``"usage":null`` is forwarded without parsing),
JSON parsed only until the first generated delta, for the finish chunk and for usage
(``StreamWatch`` in gateway/proxy.py), the usage chunk the gateway asked for on its own behalf
dropped; a broken upstream ends with chat's ``data: {"error": …}`` event and ``[DONE]``. Other
surfaces subclass it (gateway/surface.py ``TranslatingRelay``, gateway/native_relay.py).
"""

from __future__ import annotations

import re
import time

import httpx
from starlette.types import Send

from gateway.errors import error_body
from gateway.proxy import SSE_HEADERS, StreamWatch
from gateway.wire import SILENCE, WireResponse

_EVENT_END = re.compile(rb"\r?\n\r?\n")


def _cut(buffer: bytes) -> int:
    """Where the last complete event in ``buffer`` ends (0: none yet)."""
    if b"\r" not in buffer:
        end = buffer.rfind(b"\n\n")
        return end + 2 if end >= 0 else 0
    cut = 0
    for match in _EVENT_END.finditer(buffer):
        cut = match.end()
    return cut


def split_events(events: bytes) -> list[bytes]:
    """Whole SSE events (each with its blank line) → one item per event."""
    if b"\r" in events:
        parts, start = [], 0
        for match in _EVENT_END.finditer(events):
            parts.append(events[start : match.end()])
            start = match.end()
        return parts
    if events.find(b"\n\n") == len(events) - 2:
        return [events]  # the common case: one event per read
    return [e + b"\n\n" for e in events[:-2].split(b"\n\n")]


def _forward(events: bytes, watch: StreamWatch, now: float) -> bytes:
    """``events`` (whole SSE events) minus what the gateway strips; first token and usage noted."""
    result = watch.result
    parts = split_events(events)
    kept: list[bytes] = []
    for event in parts:
        if (
            result.first_token_at is not None
            and b'"finish_reason":null' in event
            and (b'"usage":null' in event or b'"usage"' not in event)
        ):
            result.output_chunks += 1
            result.last_token_at = now
            kept.append(event)
        elif watch.forward(event):
            kept.append(event)
    if len(kept) == len(parts):
        return events
    return b"".join(kept)


class SseFilter:
    """What one relay does to an upstream SSE stream's events (base: chat's byte-exact passthrough;
    see the module docstring). One per stream: a subclass may keep state."""

    def __init__(self, watch: StreamWatch) -> None:
        self.watch = watch

    def start(self) -> bytes:
        """Bytes sent right after the 200 headers (before any upstream event)."""
        return b""

    def events(self, events: bytes, now: float) -> bytes:
        """Whole upstream events that arrived together → the bytes the client gets (may be b"")."""
        return _forward(events, self.watch, now)

    def silence(self) -> bytes:
        """What the client gets after ``keepalive_s`` of upstream silence."""
        return SILENCE

    def broken(self, status: int, message: str, code: str) -> bytes:
        """The last event of a stream whose upstream broke off (``code``: ``upstream_timeout`` or
        ``upstream_stream_broken``)."""
        return b"data: " + error_body(status, message, code) + b"\n\ndata: [DONE]\n\n"

    def end(self, rest: bytes) -> bytes:
        """The last bytes: ``rest`` is what followed the last complete event (b"" after ``broken``)."""
        return rest


async def relay_events(
    response: WireResponse, send: Send, sse: SseFilter, keepalive_s: float, extra_headers: list[tuple[bytes, bytes]]
) -> None:
    """Relay an upstream SSE response to the client through ``sse``; a broken stream ends with
    ``sse.broken``. Cancelled (the client left), it stops at once; the caller closes the upstream."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra_headers})
    result = sse.watch.result
    first = sse.start()
    if first:
        await send({"type": "http.response.body", "body": first, "more_body": True})
        result.client_bytes += len(first)
    if keepalive_s > 0:
        response.watch_silence(keepalive_s)  # SSE comments keep ingress idle timers from cutting a prefill
    buffer = b""
    rest = b""
    try:
        while True:
            data = await response.receive()
            if not data:
                break
            if data is SILENCE:
                out = sse.silence()
            else:
                buffer = buffer + data if buffer else data
                cut = _cut(buffer)
                if not cut:
                    continue
                out = sse.events(buffer[:cut], time.monotonic())
                buffer = buffer[cut:]
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                result.client_bytes += len(out)
        rest = buffer
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        kind = "timeout" if isinstance(exc, httpx.TimeoutException) else "stream_broken"
        result.stream_error = kind
        message = (
            "The upstream stream went silent for too long."
            if kind == "timeout"
            else "The upstream connection broke during the stream."
        )
        data = sse.broken(504 if kind == "timeout" else 502, message, f"upstream_{kind}")
        if data:
            await send({"type": "http.response.body", "body": data, "more_body": True})
            result.client_bytes += len(data)
    last = sse.end(rest)
    await send({"type": "http.response.body", "body": last, "more_body": False})
    result.client_bytes += len(last)


async def relay_sse(
    response: WireResponse, send: Send, watch: StreamWatch, keepalive_s: float, extra_headers: list[tuple[bytes, bytes]]
) -> None:
    """Chat's byte-exact relay (``SseFilter``) of an upstream SSE response."""
    await relay_events(response, send, SseFilter(watch), keepalive_s, extra_headers)
