"""The SSE relay: upstream bytes to the client, whole events, as they arrive, with as little work
per chunk as the contract allows.

Per read from upstream: one byte scan for event boundaries, a byte check per event (after the first
token, a chunk with ``"finish_reason":null`` and ``"usage":null`` is forwarded without parsing),
and one ``send`` for everything that arrived together (events that came in one read, or piled up
while the worker was busy, go out in one write: under load the relay coalesces instead of falling
behind). JSON is parsed only until the first generated delta, for the finish chunk and for usage
(``StreamWatch`` in gateway/proxy.py). No task, lock or timeout object per chunk: keep-alive
comments and the idle timeout come from the connection's one lazily re-armed timer (gateway/wire.py).
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


def _forward(events: bytes, watch: StreamWatch, now: float) -> bytes:
    """``events`` (whole SSE events) minus what the gateway strips; first token and usage noted."""
    result = watch.result
    if b"\r" in events:
        parts, start = [], 0
        for match in _EVENT_END.finditer(events):
            parts.append(events[start : match.end()])
            start = match.end()
    elif events.find(b"\n\n") == len(events) - 2:
        parts = [events]  # the common case: one event per read
    else:
        parts = [e + b"\n\n" for e in events[:-2].split(b"\n\n")]
    kept: list[bytes] = []
    for event in parts:
        if (result.first_token_at is not None and b'"finish_reason":null' in event
                and (b'"usage":null' in event or b'"usage"' not in event)):
            result.output_chunks += 1
            result.last_token_at = now
            kept.append(event)
        elif watch.forward(event):
            kept.append(event)
    if len(kept) == len(parts):
        return events
    return b"".join(kept)


async def relay_sse(response: WireResponse, send: Send, watch: StreamWatch, keepalive_s: float,
                    extra_headers: list[tuple[bytes, bytes]]) -> None:
    """Relay an upstream SSE response to the client; a broken stream ends with an error event and [DONE]."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra_headers})
    result = watch.result
    if keepalive_s > 0:
        response.watch_silence(keepalive_s)  # SSE comments keep ingress idle timers from cutting a prefill
    buffer = b""
    try:
        while True:
            data = await response.receive()
            if not data:
                break
            if data is SILENCE:
                out = SILENCE
            else:
                buffer = buffer + data if buffer else data
                cut = _cut(buffer)
                if not cut:
                    continue
                out = _forward(buffer[:cut], watch, time.monotonic())
                buffer = buffer[cut:]
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                result.client_bytes += len(out)
        if buffer:
            await send({"type": "http.response.body", "body": buffer, "more_body": True})
            result.client_bytes += len(buffer)
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        kind = "timeout" if isinstance(exc, httpx.TimeoutException) else "stream_broken"
        result.stream_error = kind
        message = ("The upstream stream went silent for too long." if kind == "timeout"
                   else "The upstream connection broke during the stream.")
        status = 504 if kind == "timeout" else 502
        data = b"data: " + error_body(status, message, f"upstream_{kind}") + b"\n\ndata: [DONE]\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": True})
        result.client_bytes += len(data)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
