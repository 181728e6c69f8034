"""Passthrough relays for a backend that serves /v1/responses or /v1/messages itself.

The answer is relayed byte for byte on the one relay loop (``gateway/relay/events.py``: keep-alives, one
send per read; a broken upstream ends with one error event in the surface's shape); what the
gateway needs is read on the way, as ``StreamWatch`` does for chat: the first
generated delta (time to first token), the usage (converted to chat's shape so accounting is the
same on every surface), the finish, and for Responses the final Response object (stored, so
``previous_response_id``, GET and cancel work through the gateway). Upstream errors are re-shaped
into the surface's envelope with their status kept.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.types import Send

from gateway.http.wire import WireResponse
from gateway.relay.events import SseFilter, relay_events, split_events
from gateway.relay.proxy import Result, StreamWatch, send_bytes
from gateway.surfaces.base import Relay, RelayContext
from gateway.surfaces.translate.common import sse_event
from gateway.surfaces.translate.messages import error_envelope

Reshape = Callable[[int, bytes], tuple[int, bytes]]


def responses_usage_to_chat(usage: Any) -> dict[str, Any] | None:
    """A Responses ``usage`` in chat's shape (what ``Result`` and the token accounting read)."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("input_tokens_details") or {}
    return {
        "prompt_tokens": int(usage.get("input_tokens") or 0),
        "completion_tokens": int(usage.get("output_tokens") or 0),
        "prompt_tokens_details": {"cached_tokens": int(details.get("cached_tokens") or 0)},
    }


def messages_usage_to_chat(usage: Any, known: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Anthropic ``usage`` (input counts only what the cache missed) in chat's shape, merged over
    what ``message_start`` said (``message_delta`` may carry only ``output_tokens``)."""
    if not isinstance(usage, dict):
        return known
    out = dict(known or {"prompt_tokens": 0, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}})
    if "input_tokens" in usage or "cache_read_input_tokens" in usage:
        cached = int(usage.get("cache_read_input_tokens") or 0)
        out["prompt_tokens"] = (
            int(usage.get("input_tokens") or 0) + cached + int(usage.get("cache_creation_input_tokens") or 0)
        )
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    if "output_tokens" in usage:
        out["completion_tokens"] = int(usage.get("output_tokens") or 0)
    return out


class NativeWatch(StreamWatch):
    """Reads a native Responses or Messages SSE stream (``kind``) without changing a byte."""

    def __init__(self, result: Result, on_first_token: Callable[[], None], kind: str) -> None:
        super().__init__(result, False, on_first_token)
        self.kind = kind
        self.final: dict[str, Any] | None = None
        self.finished = False

    def forward(self, event: bytes) -> bool:
        started = self.result.first_token_at is not None
        if started and b'"usage"' not in event and b"error" not in event and b"message_stop" not in event:
            self.result.output_chunks += 1
            self.result.last_token_at = time.monotonic()
            return True
        payload = _payload(event)
        if not isinstance(payload, dict):
            return True
        kind = str(payload.get("type") or "")
        if self._generated(kind, payload):
            now = time.monotonic()
            if self.result.first_token_at is None:
                self.result.first_token_at = now
                self.on_first_token()
            self.result.output_chunks += 1
            self.result.last_token_at = now
        if self.kind == "responses":
            response = payload.get("response")
            if kind in ("response.completed", "response.incomplete", "response.failed") and isinstance(response, dict):
                self.final = response
                self.finished = kind != "response.failed"
                self.result.usage = responses_usage_to_chat(response.get("usage")) or self.result.usage
                self.result.finish_reasons.append(str(response.get("status")))
        else:
            if kind == "message_start":
                message = payload.get("message") or {}
                self.result.usage = messages_usage_to_chat(message.get("usage"), self.result.usage)
            elif kind == "message_delta":
                self.result.usage = messages_usage_to_chat(payload.get("usage"), self.result.usage)
                reason = (payload.get("delta") or {}).get("stop_reason")
                if reason:
                    self.result.finish_reasons.append(str(reason))
            elif kind == "message_stop":
                self.finished = True
        if kind == "error":
            self.result.stream_error = str(payload.get("error") or payload.get("message") or "error")
        return True

    def _generated(self, kind: str, payload: dict[str, Any]) -> bool:
        if self.kind == "responses":
            return kind.endswith(".delta") or (
                kind == "response.output_item.added" and (payload.get("item") or {}).get("type") == "function_call"
            )
        return kind == "content_block_delta" or (
            kind == "content_block_start" and (payload.get("content_block") or {}).get("type") == "tool_use"
        )


def _payload(event: bytes) -> Any:
    data = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


class _Native(SseFilter):
    """The relay loop's filter of a native stream: every event read (``NativeWatch``), none changed;
    a broken upstream ends with one ``error`` event in the surface's shape (no ``[DONE]``)."""

    def __init__(self, watch: NativeWatch, kind: str) -> None:
        super().__init__(watch)
        self.kind = kind

    def events(self, events: bytes, now: float) -> bytes:
        forward = self.watch.forward
        for event in split_events(events):
            forward(event)
        return events

    def one(self, event: bytes, now: float) -> bytes:
        self.watch.forward(event)
        return event

    def broken(self, status: int, message: str, code: str) -> bytes:
        if self.kind == "messages":
            return sse_event("error", error_envelope(status, message, code))
        return sse_event(
            "error", {"type": "error", "code": code, "message": message, "param": None, "sequence_number": 0}
        )


class NativeRelay(Relay):
    """Byte-exact relay of a native Responses or Messages answer (see the module docstring).
    ``done(final, ok)`` (async) hears the final object: the Response or Message, and whether it
    completed."""

    def __init__(
        self, kind: str, reshape: Reshape, done: Callable[[dict[str, Any] | None, bool], Awaitable[None]] | None = None
    ) -> None:
        self.kind = kind
        self.reshape = reshape
        self.done = done

    async def stream(self, response: WireResponse, send: Send, ctx: RelayContext) -> None:
        watch = NativeWatch(ctx.result, ctx.first_token, self.kind)
        await relay_events(response, send, _Native(watch, self.kind), ctx.keepalive_s, ctx.headers, ctx.client)
        if not watch.finished and ctx.result.stream_error is None:
            ctx.result.stream_error = "stream_broken"
        if self.done is not None:
            await self.done(watch.final, watch.finished)

    async def whole(self, status: int, payload: bytes, content_type: bytes, send: Send, ctx: RelayContext) -> None:
        if status == 200:
            body = _json(payload)
            usage = body.get("usage") if isinstance(body, dict) else None
            ctx.result.usage = (
                responses_usage_to_chat(usage) if self.kind == "responses" else messages_usage_to_chat(usage)
            )
            if ctx.result.completion_tokens:
                ctx.result.first_token_at = time.monotonic()
                ctx.first_token()
            if self.done is not None and isinstance(body, dict):
                await self.done(body, body.get("status", "completed") != "failed")
        elif status >= 400:
            status, payload = self.reshape(status, payload)
            content_type = b"application/json"
        await send_bytes(send, status, payload, content_type, ctx.headers)


def _json(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
