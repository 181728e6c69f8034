"""The plug-in interface of a client surface: what an API (chat, completions, Responses, Messages)
adds to the one request path (``gateway/request/lifecycle.py``), and nothing else.

A surface is four parts; the request path does everything around them (auth, body cap, admission,
routing, upstream attempts and retries, release, metrics, traces, access log):

1. **parser** ``Surface.parse(raw) -> ClientRequest``: checks the client's body (raise
   ``GatewayError`` for a 400) and gives the request facts' inputs: ``model`` (the alias),
   ``stream``, ``max_tokens``, and ``prompt``, a chat-shaped mapping (``messages`` + ``tools``, or
   ``prompt``) the fingerprint is computed over. ``native`` holds the surface's own parse result.
2. **error renderer** ``Surface.error(err) -> ErrorReply``: every error the gateway answers on this
   route (401, 400, 404 model, 413, refusals 429/503 with ``Retry-After``, 502/504) in the
   surface's envelope; the path adds ``x-request-id`` (and ``retry-after``) headers.
3. **upstream request builder** ``Surface.upstream(req, target) -> UpstreamCall``: per backend
   (``Target``: its name, served model name, DP rank), the upstream path and body, and the relay
   that turns that backend's answer into this surface's answer. A passthrough surface posts to the
   same API upstream; a translating one may post ``/v1/chat/completions`` and translate back.
4. **relay** ``Relay``: ``stream`` relays a 200 SSE answer, ``whole`` any other answer (non-stream,
   or an upstream error status). A relay must report to the path through ``RelayContext``: call
   ``ctx.first_token()`` at the first generated token; fill ``ctx.result`` (``usage`` as an
   OpenAI usage dict, ``finish_reasons``, ``response_model``; ``stream_error`` ``"timeout"`` or
   ``"stream_broken"`` when the upstream broke off, any other text for an error event); and send
   the complete ASGI response (``http.response.start`` and a last body message). ``PassthroughRelay``
   is the byte-exact relay of an OpenAI-shaped answer (chat, completions); ``TranslatingRelay``
   relays an upstream chat stream on the same loop (``gateway/relay/events.py``) and rewrites each event (a
   subclass gives ``translate_event``, ``start_stream``, ``finish_stream``, ``translate_whole``).

To add a surface: subclass ``Surface`` (``name``, ``path``, the three methods), give it a ``Relay``
if its answers are not relayed byte for byte, and list it in ``gateway/app.py``'s ``default_surfaces``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Send

from backends.config import BackendConfig
from gateway.http.errors import GatewayError, error_body
from gateway.http.wire import SILENCE, WireResponse
from gateway.relay.events import ClientOut, SseFilter, relay_events, split_events
from gateway.relay.proxy import Result, StreamWatch, read_usage, send_bytes, send_messages, send_whole
from gateway.surfaces.translate.responses import reshape_upstream_error

Headers = list[tuple[bytes, bytes]]


@dataclass(slots=True)
class ClientRequest:
    """What a surface's parser makes of a client's body: the inputs of the request's facts."""

    model: str
    """The model alias the client named (checked against the config by the path)."""
    stream: bool
    max_tokens: int | None
    prompt: Mapping[str, Any]
    """Chat-shaped (``messages`` + ``tools``) or completion-shaped (``prompt``): what is fingerprinted."""
    body: dict[str, Any]
    """The client's body as parsed (traces read sampling parameters from it)."""
    native: object = None
    """The surface's own parse result, for its ``upstream``."""
    prompt_bytes: int = 0
    """Bytes of the rendered prompt (set by the path; feeds the learned tokens-per-byte ratio)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The client's request headers (set by the path: e.g. ``anthropic-version`` to forward)."""
    team: str = ""
    """The caller's team (set by the path before ``Surface.prepare``)."""
    client: ClientOut | None = None
    """The client's connection if the server lends it to the relay (set by the path)."""
    fingerprint: tuple[tuple[int, int], ...] = ()
    """The prompt's fingerprint (set by the path; a disaggregated pool's prefill choice reads it)."""


@dataclass(slots=True)
class Target:
    """The backend an attempt goes to, as a surface needs to know it.

    ``Target``, ``RelayContext`` and ``UpstreamCall`` are made once per request and only read after:
    plain slotted dataclasses, since a frozen one's ``__init__`` sets each field through
    ``object.__setattr__`` (a call per field where a slot store would do, on every request)."""

    backend: str
    upstream_model: str
    """The model name the backend serves (the alias is rewritten to it)."""
    rank: int | None
    """DP rank to pin (``routed_dp_rank``), None for a backend without DP attention."""
    config: BackendConfig | None = None
    """The backend's configuration, for a per-backend choice (e.g. a field saying the backend
    serves ``/v1/responses`` itself, so a surface posts there instead of translating)."""


@dataclass(slots=True)
class RelayContext:
    """What a relay reports to, and the few settings it needs."""

    result: Result
    first_token: Callable[[], None]
    keepalive_s: float
    """Send an SSE keep-alive after this much upstream silence (0: never)."""
    headers: Headers
    """Headers the path adds to the client's response (``x-request-id``)."""
    client: ClientOut | None = None
    """The client's connection, for the callback relay (``relay_events``)."""


class Relay(ABC):
    """Turns one upstream answer into the client's answer (see the module docstring)."""

    @abstractmethod
    async def stream(self, response: WireResponse, send: Send, ctx: RelayContext) -> None:
        """Relay a 200 event-stream answer as it arrives (``gateway/relay/events.py`` is the loop to run it on)."""

    @abstractmethod
    async def whole(self, status: int, payload: bytes, content_type: bytes, send: Send, ctx: RelayContext) -> None:
        """Relay a complete answer (non-stream, or any upstream status other than 200)."""


class PassthroughRelay(Relay):
    """Byte-exact relay of an OpenAI-shaped answer; drops the usage chunk the gateway asked for on its
    own behalf (``strip_usage``)."""

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage

    async def stream(self, response: WireResponse, send: Send, ctx: RelayContext) -> None:
        watch = StreamWatch(ctx.result, self.strip_usage, ctx.first_token)
        await relay_events(response, send, SseFilter(watch), ctx.keepalive_s, ctx.headers, ctx.client)

    async def whole(self, status: int, payload: bytes, content_type: bytes, send: Send, ctx: RelayContext) -> None:
        if status == 200:
            read_usage(payload, ctx.result)
            if ctx.result.completion_tokens:
                ctx.result.first_token_at = time.monotonic()
                ctx.first_token()
        elif status >= 400:  # SGLang's flat {"object": "error", ...} → OpenAI's envelope, status kept
            status, payload = reshape_upstream_error(status, payload)
            content_type = b"application/json"
        if not send_whole(send, status, payload, content_type, ctx.headers):  # the common case: no coroutine
            await send_messages(send, status, payload, content_type, ctx.headers)


class _Translating(SseFilter):
    """The relay loop's filter of a ``TranslatingRelay``: chat's accounting over each upstream event
    (nothing stripped), then the relay's ``translate_event``."""

    def __init__(self, watch: StreamWatch, relay: TranslatingRelay) -> None:
        super().__init__(watch)
        self.relay = relay

    def start(self) -> bytes:
        return self.relay.start_stream()

    def events(self, events: bytes, now: float) -> bytes:
        watch, translate = self.watch, self.relay.translate_event
        out: list[bytes] = []
        for event in split_events(events):
            watch.forward(event)
            out.append(translate(event))
        return b"".join(out)

    def one(self, event: bytes, now: float) -> bytes:
        self.watch.forward(event)
        return self.relay.translate_event(event)

    def silence(self) -> bytes:
        return self.relay.translate_event(SILENCE)

    def broken(self, status: int, message: str, code: str) -> bytes:
        # chat's own error event and [DONE], each translated like any upstream event
        translate = self.relay.translate_event
        return translate(b"data: " + error_body(status, message, code) + b"\n\n") + translate(b"data: [DONE]\n\n")

    def end(self, rest: bytes) -> bytes:
        return self.relay.finish_stream()  # an incomplete last event is dropped: it cannot be translated


class TranslatingRelay(Relay):
    """Relays an upstream chat-completions stream on the one relay loop (``gateway/relay/events.py``:
    keep-alive comments, the in-stream error event of a broken upstream, first-token and usage
    accounting, all as for chat) and rewrites each complete SSE event on its way to the client with
    ``translate_event``.

    A subclass (one per request: it may keep state, e.g. the output index of a Responses stream)
    gives ``translate_event`` (an upstream event, a ``: keepalive`` comment, or the gateway's own
    ``data: {"error": ...}`` event → the bytes the client gets, ``b""`` to drop), ``start_stream``
    (bytes sent with the 200 headers), ``finish_stream`` (bytes sent after the last event) and
    ``translate_whole`` (a complete answer or error)."""

    @abstractmethod
    def translate_event(self, event: bytes) -> bytes:
        """One complete upstream SSE event (with its blank line) → bytes for the client."""

    def start_stream(self) -> bytes:
        """Bytes sent right after the 200 headers, before any upstream event."""
        return b""

    def finish_stream(self) -> bytes:
        """Bytes sent after the last translated event."""
        return b""

    @abstractmethod
    def translate_whole(self, status: int, payload: bytes, content_type: bytes) -> tuple[int, bytes, bytes]:
        """A complete upstream answer (``status``, body, content type) → the client's."""

    async def stream(self, response: WireResponse, send: Send, ctx: RelayContext) -> None:
        watch = StreamWatch(ctx.result, False, ctx.first_token)
        await relay_events(response, send, _Translating(watch, self), ctx.keepalive_s, ctx.headers, ctx.client)

    async def whole(self, status: int, payload: bytes, content_type: bytes, send: Send, ctx: RelayContext) -> None:
        if status == 200:
            read_usage(payload, ctx.result)
            if ctx.result.completion_tokens:
                ctx.result.first_token_at = time.monotonic()
                ctx.first_token()
        status, body, ctype = self.translate_whole(status, payload, content_type)
        await send_bytes(send, status, body, ctype, ctx.headers)


@dataclass(slots=True)
class UpstreamCall:
    """One attempt's request to a backend, and how its answer comes back."""

    path: str
    """Upstream path, e.g. ``/v1/chat/completions``."""
    body: bytes
    relay: Relay
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra upstream headers (the path sets content type, accept, request id, auth, traceparent)."""


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An error answer in a surface's envelope."""

    status: int
    body: bytes
    content_type: bytes = b"application/json"
    headers: Headers = field(default_factory=list)


def openai_error(err: GatewayError) -> ErrorReply:
    """OpenAI's envelope ``{"error": {message, type, param, code}}`` (``gateway/http/errors.py``)."""
    headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    return ErrorReply(err.status, error_body(err.status, err.message, err.code, err.param), headers=headers)


class Surface(ABC):
    """One client API on the request path (see the module docstring)."""

    name: str
    """Short name: the span operation key (``gateway/observability/telemetry.py``), the access log's ``surface``."""
    path: str
    """The client route, e.g. ``/v1/chat/completions`` (also the metrics' ``route`` label)."""

    @abstractmethod
    def parse(self, raw: bytes) -> ClientRequest:
        """Check the client's body; raise ``GatewayError`` (400) for a bad one."""

    @abstractmethod
    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        """The request to send to ``target`` for ``req``."""

    def error(self, err: GatewayError) -> ErrorReply:
        """``err`` in this surface's envelope (default: OpenAI's)."""
        return openai_error(err)

    def bind(self, gateway: Any) -> None:
        """Called once by ``create_app`` with the worker's ``Gateway`` (a surface that needs the
        response store, the pool or the token estimator keeps it)."""
        return None

    async def close(self) -> None:
        """Called once when the worker stops (close what ``bind`` opened)."""
        return None

    async def prepare(self, req: ClientRequest) -> None:
        """Async work after ``parse`` and before admission (e.g. resolve ``previous_response_id``);
        may raise ``GatewayError``. ``req.team`` and ``req.headers`` are set."""
        return None

    def waiting(self) -> bytes:
        """What a streamed request's opened response gets while it still waits in the queue."""
        return b": keepalive\n\n"

    def stream_error(self, status: int, body: bytes) -> bytes:
        """An error answer (``status``, its body in this surface's envelope) as the last event of a
        stream whose 200 headers already went out (default: chat's ``data: {"error": …}`` + [DONE])."""
        return b"data: " + body + b"\n\ndata: [DONE]\n\n"
