"""What the upstream hop learns from an answer (``Result``), and how it reads one.

SSE is relayed event by event as it arrives, bytes untouched (gateway/relay/events.py, over the lean
client of gateway/http/wire.py). The only things read are the first generated delta (time to first
token) and the usage chunk; the usage chunk the gateway asked for on its own behalf is dropped
before the client sees it (``StreamWatch``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.types import Message, Send

from gateway.http.wire import SILENCE, WireResponse

_USAGE_NULL = re.compile(rb'"usage"\s*:\s*null')
RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.RemoteProtocolError)

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


@dataclass(slots=True)
class Result:
    """What the gateway learned from one upstream exchange."""

    status: int = 0
    first_token_at: float | None = None
    usage: dict[str, Any] | None = None
    finish_reasons: list[str] = field(default_factory=list)
    response_model: str | None = None
    output_chunks: int = 0
    last_token_at: float | None = None
    stream_error: str | None = None
    client_bytes: int = 0

    @property
    def prompt_tokens(self) -> int:
        return int((self.usage or {}).get("prompt_tokens") or 0)

    @property
    def completion_tokens(self) -> int:
        return int((self.usage or {}).get("completion_tokens") or 0)

    @property
    def cached_tokens(self) -> int:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0


def _generated(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(
            delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or delta.get("tool_calls")
        )
    return bool(choice.get("text"))


class StreamWatch:
    """Reads the few things the gateway needs from each SSE event, and says whether to forward it."""

    def __init__(self, result: Result, strip_usage: bool, on_first_token: Callable[[], None]) -> None:
        self.result = result
        self.strip_usage = strip_usage
        self.on_first_token = on_first_token

    def forward(self, event: bytes) -> bool:
        has_usage = b'"usage"' in event and not _USAGE_NULL.search(event)
        if self.result.first_token_at is not None and not has_usage and b'"finish_reason":null' in event:
            self.result.output_chunks += 1
            self.result.last_token_at = time.monotonic()
            return True
        payload = _payload(event)
        if not isinstance(payload, dict):
            return True
        choices = payload.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if not isinstance(choice, dict):
                    continue
                if _generated(choice):
                    now = time.monotonic()
                    if self.result.first_token_at is None:
                        self.result.first_token_at = now
                        self.on_first_token()
                    self.result.output_chunks += 1
                    self.result.last_token_at = now
                reason = choice.get("finish_reason")
                if reason:
                    self.result.finish_reasons.append(str(reason))
        if self.result.response_model is None and isinstance(payload.get("model"), str):
            self.result.response_model = payload["model"]
        if "error" in payload:
            self.result.stream_error = str(payload.get("error"))
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.result.usage = usage
            if self.strip_usage and choices == []:
                return False
        return True


def _payload(event: bytes) -> Any:
    data = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


BODY_LIMIT = 64 * 1024 * 1024


async def read_body(response: WireResponse, limit: int = BODY_LIMIT) -> bytes:
    # receive() in a loop rather than ``async for`` over aiter_raw(): an async generator per
    # response costs the event loop's first-iteration hook (a WeakSet entry added and removed).
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await response.receive()
        if chunk is SILENCE:
            continue
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            break
        parts.append(chunk)
    return b"".join(parts)


async def send_bytes(
    send: Send, status: int, body: bytes, content_type: bytes, extra_headers: list[tuple[bytes, bytes]]
) -> None:
    """A whole response: in one write when ``send`` can (a ``WholeSend``), else two ASGI messages."""
    if not send_whole(send, status, body, content_type, extra_headers):
        await send_messages(send, status, body, content_type, extra_headers)


def send_whole(
    send: Send, status: int, body: bytes, content_type: bytes, extra_headers: list[tuple[bytes, bytes]]
) -> bool:
    """``send_bytes``'s first way, without a coroutine: True if ``send`` wrote it all at once."""
    return isinstance(send, WholeSend) and send.whole(status, [(b"content-type", content_type), *extra_headers], body)


async def send_messages(
    send: Send, status: int, body: bytes, content_type: bytes, extra_headers: list[tuple[bytes, bytes]]
) -> None:
    """``send_bytes``'s other way: the head (with ``content-length``) and the body as ASGI messages."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class WholeSend:
    """An ASGI ``send`` that can also write a whole response at once (the request path's, on our
    server: ``gateway/request/lifecycle.py``)."""

    __slots__ = ()

    async def __call__(self, message: Message) -> None:
        raise NotImplementedError

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Head (plus ``content-length``) and ``body`` sent; False if not possible now (use the messages)."""
        return False


def read_usage(body: bytes, result: Result) -> None:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if not isinstance(payload, dict):
        return
    usage = payload.get("usage")
    if isinstance(usage, dict):
        result.usage = usage
    if isinstance(payload.get("model"), str):
        result.response_model = payload["model"]
    for choice in payload.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            result.finish_reasons.append(str(choice["finish_reason"]))
