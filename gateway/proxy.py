"""The upstream hop: forward a request to a backend and relay its answer.

SSE is relayed event by event as it arrives, bytes untouched. The only things read are the first
generated delta (time to first token) and the usage chunk; the usage chunk the gateway asked for
on its own behalf is dropped before the client sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.types import Send

from gateway.errors import error_body

_USAGE_NULL = re.compile(rb'"usage"\s*:\s*null')
_EVENT_END = re.compile(rb"\r?\n\r?\n")
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
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
                    or delta.get("tool_calls"))
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


async def relay_stream(response: httpx.Response, send: Send, watch: StreamWatch, keepalive_s: float,
                       extra_headers: list[tuple[bytes, bytes]]) -> None:
    """Relay an upstream SSE response to the client, event by event."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + extra_headers})
    result = watch.result
    lock = asyncio.Lock()
    last_sent = time.monotonic()

    async def emit(data: bytes) -> None:
        nonlocal last_sent
        async with lock:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        last_sent = time.monotonic()
        result.client_bytes += len(data)

    async def keepalive() -> None:
        # SSE comments keep ingress and load-balancer idle timers from cutting a long prefill.
        while True:
            await asyncio.sleep(max(0.05, keepalive_s - (time.monotonic() - last_sent)))
            if time.monotonic() - last_sent >= keepalive_s:
                await emit(b": keepalive\n\n")

    pinger = asyncio.create_task(keepalive()) if keepalive_s > 0 else None
    buffer = b""
    try:
        try:
            async for chunk in response.aiter_raw():
                buffer += chunk
                out: list[bytes] = []
                start = 0
                for match in _EVENT_END.finditer(buffer):
                    event = buffer[start : match.end()]
                    start = match.end()
                    if watch.forward(event):
                        out.append(event)
                buffer = buffer[start:]
                if out:
                    await emit(b"".join(out))
            if buffer:
                await emit(buffer)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            kind = "timeout" if isinstance(exc, httpx.TimeoutException) else "stream_broken"
            result.stream_error = kind
            message = ("The upstream stream went silent for too long." if kind == "timeout"
                       else "The upstream connection broke during the stream.")
            status = 504 if kind == "timeout" else 502
            await emit(b"data: " + error_body(status, message, f"upstream_{kind}") + b"\n\ndata: [DONE]\n\n")
    finally:
        if pinger is not None:
            pinger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pinger
    async with lock:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def read_body(response: httpx.Response, limit: int = 64 * 1024 * 1024) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if size > limit:
            break
        parts.append(chunk)
    return b"".join(parts)


async def send_bytes(send: Send, status: int, body: bytes, content_type: bytes,
                     extra_headers: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


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


OpenStream = Callable[[], Awaitable[httpx.Response]]
