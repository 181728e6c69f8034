"""What both surfaces share: SSE framing, ids, token counts from chat usage, upstream error bodies."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.http.errors import GatewayError

_EVENT_END = re.compile(rb"\r?\n\r?\n")


def new_id(prefix: str) -> str:
    """An id in the style of the surface (``resp_…``, ``msg_…``, ``fc_…``): prefix + 32 hex digits."""
    return prefix + uuid.uuid4().hex


def sse_event(name: str | None, data: Any) -> bytes:
    """One SSE event: ``event: NAME`` (when named) and one ``data:`` line of compact JSON."""
    body = orjson.dumps(data)
    if name is None:
        return b"data: " + body + b"\n\n"
    return b"event: " + name.encode() + b"\ndata: " + body + b"\n\n"


class SSEDecoder:
    """Cuts an upstream chat SSE byte stream into parsed ``data:`` payloads.

    ``feed`` takes raw bytes as they arrive (events may be split anywhere) and returns the JSON
    payloads completed by them; ``data: [DONE]`` sets ``done``; comments and unparseable events are
    skipped (``skipped`` counts the latter).
    """

    def __init__(self) -> None:
        self._buffer = b""
        self.done = False
        self.skipped = 0

    def feed(self, chunk: bytes) -> list[Any]:
        self._buffer += chunk
        out: list[Any] = []
        start = 0
        for match in _EVENT_END.finditer(self._buffer):
            self._take(self._buffer[start : match.start()], out)
            start = match.end()
        self._buffer = self._buffer[start:]
        return out

    def close(self) -> list[Any]:
        """Payloads of a last event that was not followed by a blank line."""
        out: list[Any] = []
        if self._buffer.strip():
            self._take(self._buffer, out)
        self._buffer = b""
        return out

    def _take(self, event: bytes, out: list[Any]) -> None:
        data = b"\n".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
        if not data:
            return
        if data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            out.append(orjson.loads(data))
        except orjson.JSONDecodeError:
            self.skipped += 1


@dataclass(slots=True)
class ChatUsage:
    """Token counts of a chat completion, read from its ``usage`` (SGLang's fields or OpenAI's)."""

    prompt: int = 0
    cached: int = 0
    completion: int = 0
    reasoning: int = 0

    @classmethod
    def read(cls, usage: Any) -> ChatUsage:
        if not isinstance(usage, dict):
            return cls()
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        out_details = usage.get("completion_tokens_details")
        reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
        if reasoning is None:
            reasoning = usage.get("reasoning_tokens")
        prompt = _int(usage.get("prompt_tokens"))
        return cls(prompt, min(_int(cached), prompt), _int(usage.get("completion_tokens")), _int(reasoning))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(slots=True)
class UpstreamError:
    """An error an upstream answered, whatever its shape: status kept, the rest best effort."""

    status: int
    message: str
    type: str | None = None
    code: str | None = None
    param: str | None = None


def read_upstream_error(status: int, body: bytes | dict[str, Any] | str | None) -> UpstreamError:
    """Read SGLang's flat ``{"object":"error","message",…,"code":400}``, OpenAI's nested
    ``{"error":{…}}``, Anthropic's ``{"type":"error","error":{…}}``, a mid-stream ``{"error": "…"}``
    or plain text. A non-error status (a mid-stream error arrives under 200) becomes 502."""
    if status < 400:
        status = 502
    payload: Any = body
    if isinstance(body, bytes | str):
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            return UpstreamError(status, text.strip()[:2000] or f"The upstream answered HTTP {status}.")
    if not isinstance(payload, dict):
        return UpstreamError(status, f"The upstream answered HTTP {status}.")
    inner = payload.get("error")
    if isinstance(inner, str):
        return UpstreamError(status, inner)
    source = inner if isinstance(inner, dict) else payload
    message = source.get("message") or source.get("detail") or f"The upstream answered HTTP {status}."
    code = source.get("code")
    return UpstreamError(
        status,
        str(message),
        _str(source.get("type")),
        None if code is None or isinstance(code, int) else str(code),
        _str(source.get("param")),
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def bad(message: str, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    """A 400 for a body the translation cannot take."""
    return GatewayError(400, message, code, param)


def load_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    if not raw:
        raise bad("The request body is empty; expected a JSON object.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.")
    return body


def chunk_parts(payload: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """The parts of one chat chunk's first choice in stream order: ``("thinking", str)``,
    ``("text", str)``, ``("tool", dict)`` per tool-call delta, ``("finish", choice)``."""
    for choice in payload.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        thinking = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(thinking, str) and thinking:
            yield "thinking", thinking
        text = delta.get("content")
        if isinstance(text, str) and text:
            yield "text", text
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                yield "tool", call
        if choice.get("finish_reason"):
            yield "finish", choice


def parse_arguments(arguments: str) -> dict[str, Any]:
    """A tool call's JSON argument string as the object Anthropic's ``input`` must be; a string that
    is not a JSON object (a model's broken output) is kept whole under ``_raw`` rather than lost."""
    if not arguments.strip():
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_raw": arguments}
