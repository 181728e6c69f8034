"""The SSE relay: upstream bytes to the client, whole events, as they arrive, with as little work
per chunk as the contract allows. Every relay of every surface runs on this one loop
(``relay_events``); what differs per surface is an ``SseFilter``.

Per read from upstream: one byte scan for event boundaries, the filter over the whole events that
arrived, and one ``send`` for everything that came together (events that came in one read, or piled
up while the worker was busy, go out in one write: under load the relay coalesces instead of
falling behind). No task, lock or timeout object per chunk: keep-alive comments and the idle
timeout come from the connection's one lazily re-armed timer (gateway/http/wire.py).

Where the server lends the client's connection (``ClientOut``: our uvicorn protocol,
gateway/http/server.py), the relay runs on callbacks instead: after the headers went out through
ASGI, each upstream read runs the filter in the upstream protocol's ``data_received`` and writes the
chunk frame straight to the client's transport (no task wake-up, no ASGI ``send`` per chunk); a
client past its transport's high-water mark pauses reading from upstream until it drains. The task
only waits for the end (upstream done or broken, or the client leaving cancels it) and finishes the
response through ASGI. Elsewhere (in-process test clients, other servers) the task loop runs.

The base ``SseFilter`` is chat's byte-exact passthrough: a byte check per event (after the first
token, a chunk with ``"finish_reason":null`` and ``"usage":null`` is forwarded without parsing),
JSON parsed only until the first generated delta, for the finish chunk and for usage
(``StreamWatch`` in gateway/relay/proxy.py), the usage chunk the gateway asked for on its own behalf
dropped; a broken upstream ends with chat's ``data: {"error": …}`` event and ``[DONE]``. Other
surfaces subclass it (gateway/surfaces/base.py ``TranslatingRelay``, gateway/surfaces/native_relay.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import re
import time
from collections.abc import Callable
from typing import Protocol

import httpx
from starlette.types import Send

from gateway.http.errors import error_body
from gateway.http.wire import SILENCE, UpstreamMalformed, WireResponse
from gateway.relay.proxy import SSE_HEADERS, StreamWatch

_EVENT_END = re.compile(rb"\r?\n\r?\n")
MALFORMED = "upstream_malformed_response"
"""The error code of an upstream answer that is not valid HTTP/1.1 (gateway/http/wire.py)."""


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
            and event.rfind(b'"finish_reason":null') >= 0  # from the end: see ``SseFilter.one``
            and (event.rfind(b'"usage":null') >= 0 or b'"usage"' not in event)
        ):
            result.output_chunks += 1
            result.last_token_at = now
            kept.append(event)
        elif watch.forward(event):
            kept.append(event)
    if len(kept) == len(parts):
        return events
    return b"".join(kept)


class ClientOut(Protocol):
    """The client's connection, lent to the relay (gateway/http/server.py)."""

    on_writable: Callable[[bool], None] | None

    def direct_transport(self) -> asyncio.Transport | None: ...

    def writing_paused(self) -> bool: ...


class SseFilter:
    """What one relay does to an upstream SSE stream's events (base: chat's byte-exact passthrough;
    see the module docstring). One per stream: a subclass may keep state."""

    def __init__(self, watch: StreamWatch) -> None:
        self.watch = watch
        self.result = watch.result

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "events" in cls.__dict__ and "one" not in cls.__dict__:
            cls.one = cls._one_via_events  # type: ignore[method-assign]  # a filter that only changes ``events``

    def _one_via_events(self, event: bytes, now: float) -> bytes:
        return self.events(event, now)

    def start(self) -> bytes:
        """Bytes sent right after the 200 headers (before any upstream event)."""
        return b""

    def events(self, events: bytes, now: float) -> bytes:
        """Whole upstream events that arrived together → the bytes the client gets (may be b"")."""
        return _forward(events, self.watch, now)

    def one(self, event: bytes, now: float) -> bytes:
        """``events`` for a read of exactly one single-line event (the steady state of a stream);
        returns ``event`` itself when it goes out unchanged (the relay then forwards the upstream's
        chunk frame as it came). Chat's: ``_forward``'s first case inline, from the end of the
        event, where SGLang and OpenAI put ``finish_reason`` and ``usage``."""
        result = self.result
        if (
            result.first_token_at is not None
            and event.rfind(b'"finish_reason":null') >= 0
            and (event.rfind(b'"usage":null') >= 0 or b'"usage"' not in event)
        ):
            result.output_chunks += 1
            result.last_token_at = now
            return event
        return event if self.watch.forward(event) else b""

    def silence(self) -> bytes:
        """What the client gets after ``keepalive_s`` of upstream silence."""
        return SILENCE

    def broken(self, status: int, message: str, code: str) -> bytes:
        """The last event of a stream whose upstream broke off (``code``: ``upstream_timeout``,
        ``upstream_stream_broken`` or ``upstream_malformed_response``)."""
        return b"data: " + error_body(status, message, code) + b"\n\ndata: [DONE]\n\n"

    def end(self, rest: bytes) -> bytes:
        """The last bytes: ``rest`` is what followed the last complete event (b"" after ``broken``)."""
        return rest


async def relay_events(
    response: WireResponse,
    send: Send,
    sse: SseFilter,
    keepalive_s: float,
    extra_headers: list[tuple[bytes, bytes]],
    client: ClientOut | None = None,
) -> None:
    """Relay an upstream SSE response to the client through ``sse``; a broken stream ends with
    ``sse.broken``. Cancelled (the client left), it stops at once; the caller closes the upstream.
    With ``client``, chunks are written on callbacks (module docstring)."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra_headers})
    result = sse.watch.result
    first = sse.start()
    if first:
        await send({"type": "http.response.body", "body": first, "more_body": True})
        result.client_bytes += len(first)
    if keepalive_s > 0:
        response.watch_silence(keepalive_s)  # SSE comments keep ingress idle timers from cutting a prefill
    rest = b""
    transport = client.direct_transport() if client is not None else None
    try:
        if client is not None and transport is not None:
            rest = await _relay_direct(response, client, transport, sse)
        else:
            rest = await _relay_loop(response, send, sse)
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        kind, status, message, code = broken_stream(exc)
        result.stream_error = kind
        data = sse.broken(status, message, code)
        if data:
            await send({"type": "http.response.body", "body": data, "more_body": True})
            result.client_bytes += len(data)
    last = sse.end(rest)
    await send({"type": "http.response.body", "body": last, "more_body": False})
    result.client_bytes += len(last)


def broken_stream(exc: httpx.HTTPError) -> tuple[str, int, str, str]:
    """How a stream whose upstream failed ends: its ``stream_error`` kind, and the status, message
    and error code of the surface's last event."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout", 504, "The upstream stream went silent for too long.", "upstream_timeout"
    if isinstance(exc, UpstreamMalformed):
        return "malformed", 502, "The upstream sent a malformed HTTP response.", MALFORMED
    return "stream_broken", 502, "The upstream connection broke during the stream.", "upstream_stream_broken"


def _step(sse: SseFilter, buffer: bytes, data: bytes) -> tuple[bytes, bytes]:
    """One upstream read -> (what goes to the client, what is left of an unfinished event): the
    whole events through the filter, or a silence's keep-alive."""
    if data is SILENCE:
        return sse.silence(), buffer
    buffer = buffer + data if buffer else data
    cut = _cut(buffer)
    if not cut:
        return b"", buffer
    return sse.events(buffer[:cut], time.monotonic()), buffer[cut:]


async def _relay_loop(response: WireResponse, send: Send, sse: SseFilter) -> bytes:
    """The task relay: one wake-up and one ASGI ``send`` per read; returns what followed the last
    complete event."""
    result = sse.watch.result
    buffer = b""
    while True:
        data = await response.receive()
        if not data:
            return buffer
        out, buffer = _step(sse, buffer, data)
        if out:
            await send({"type": "http.response.body", "body": out, "more_body": True})
            result.client_bytes += len(out)


async def _relay_direct(
    response: WireResponse, client: ClientOut, transport: asyncio.Transport, sse: SseFilter
) -> bytes:
    """The callback relay (module docstring) until the upstream ends: what followed its last
    complete event. Raises what the upstream raised (or a bug in the filter)."""
    result = sse.watch.result
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    buffer = b""
    one, events, monotonic = sse.one, sse.events, time.monotonic
    write, is_closing = transport.write, transport.is_closing

    def frame(data: bytes, body: bytes) -> bool:
        """The steady state (``WireResponse.direct``): ``data`` is one whole chunk frame (or b"" for
        several), ``body`` their data. Whole events and nothing left over from before: through the
        filter (``one`` for a single-line event, else ``events``) and out in one write, the
        upstream's frame itself when the filter forwarded one frame's event unchanged. Anything
        else declines, and the read takes ``pump``'s way."""
        if buffer or is_closing() or ended.done():  # (ended: an upstream error is on its way out)
            return False
        try:
            if body.find(b"\n") == len(body) - 2 and body[-1] == 10:  # one single-line event
                out = one(body, monotonic())
            elif body.endswith(b"\n\n") and b"\r" not in body:  # whole events (``_cut`` is the end)
                out = events(body, monotonic())
            else:
                return False
        except Exception as exc:  # a bug in the filter: the task raises it
            if not ended.done():
                ended.set_exception(exc)
            return True
        if out:
            write(data if out is body and data else b"%x\r\n%s\r\n" % (len(out), out))
            result.client_bytes += len(out)
        return True

    def pump() -> None:
        nonlocal buffer
        try:
            while not ended.done():
                data = response.take()
                if data is None:
                    return
                if not data:
                    ended.set_result(None)
                    return
                out, buffer = _step(sse, buffer, data)
                if out:
                    if is_closing():  # the client left: its watcher cancels the task
                        response.hold(True)
                        return
                    write(b"%x\r\n%s\r\n" % (len(out), out))
                    result.client_bytes += len(out)
        except Exception as exc:  # an upstream error, or a bug: the task raises it
            if not ended.done():
                ended.set_exception(exc)

    def writable(ok: bool) -> None:
        response.hold(not ok)
        if ok:
            sink()

    # The filter's callbacks see this request's context; ``Context.run`` and ``partial`` are C, so
    # this costs no Python frame per chunk.
    context = contextvars.copy_context()
    sink: Callable[[], None] = functools.partial(context.run, pump)

    client.on_writable = writable
    response.sink = sink
    response.direct = functools.partial(context.run, frame)  # type: ignore[call-arg]
    try:
        if client.writing_paused():
            response.hold(True)
        pump()
        await ended
        return buffer
    finally:
        response.sink = response.direct = None
        client.on_writable = None
        response.hold(False)


async def relay_sse(
    response: WireResponse, send: Send, watch: StreamWatch, keepalive_s: float, extra_headers: list[tuple[bytes, bytes]]
) -> None:
    """Chat's byte-exact relay (``SseFilter``) of an upstream SSE response."""
    await relay_events(response, send, SseFilter(watch), keepalive_s, extra_headers)
