"""SGLang 0.5.23's Anthropic Messages API, as data: a Messages request turned into the chat request
SGLang builds from it (``AnthropicServing._convert_to_chat_completion_request``), and the chat
result shaped back into Anthropic's message, SSE events and errors (``anthropic/serving.py``).

Shapes: pydantic ``model_dump(exclude_none=True)`` of SGLang's Anthropic protocol models, so a
field that is None is absent. Usage: ``input_tokens`` is the prompt minus its cached tokens, and
``cache_read_input_tokens`` (present when non-zero) the cached ones; ``message_delta`` carries
``output_tokens`` only. Tool-use ids are Kimi's (``functions.NAME:IDX``), passed through.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "request_timeout_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
}


class MessagesError(ValueError):
    """A request SGLang refuses while converting it (400 ``invalid_request_error``)."""


def error_body(message: str, status: int = 400) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPE.get(status, "api_error"), "message": message}}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return "" if content is None else str(content)


def is_server_tool(tool: dict[str, Any]) -> bool:
    """Anthropic's built-in tools (``web_search_20250305``...) have a type other than ``custom``."""
    return tool.get("type") not in (None, "custom")


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request SGLang runs for a Messages request (messages, tools, tool_choice, thinking)."""
    for field in ("model", "messages", "max_tokens"):
        if field not in body:
            raise MessagesError(f"{field}: Field required")
    if not isinstance(body["messages"], list):
        raise MessagesError("messages: Input should be a valid list")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    system_parts = [system] if isinstance(system, str) and system.strip() else []
    if isinstance(system, list):
        system_parts += [
            str(b["text"]) for b in system if isinstance(b, dict) and b.get("type") == "text" and b.get("text")
        ]
    for msg in body["messages"]:
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant", "system"):
            raise MessagesError("messages: each message needs a role of user or assistant")
        if msg["role"] == "system":  # Claude Code sends one; merged into the system prompt (Kimi's template)
            text = _text(msg.get("content")).strip()
            if text:
                system_parts.append(text)
            continue
        messages.extend(_convert_message(msg))
    if system_parts:
        messages.insert(0, {"role": "system", "content": "\n".join(system_parts)})
    chat: dict[str, Any] = {"messages": messages, "model": body["model"], "max_tokens": body["max_tokens"]}
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and not is_server_tool(t)]
    if tools:
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description") or "",
                    "parameters": t.get("input_schema") or {},
                },
            }
            for t in tools
        ]
    chat["tool_choice"] = _tool_choice(body.get("tool_choice"), chat.get("tools"))
    thinking = body.get("thinking")
    chat["thinking"] = isinstance(thinking, dict) and thinking.get("type") != "disabled"
    return chat


def _convert_message(msg: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = msg["role"], msg.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise MessagesError("messages.content: Input should be a valid string or list")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "redacted_thinking":
            raise MessagesError("Anthropic redacted_thinking history is not supported")
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": "image"}})
        elif kind == "tool_use":
            args = json.dumps(block.get("input") or {})
            calls.append({"id": block.get("id") or f"call_{uuid.uuid4().hex}", "type": "function",
                          "function": {"name": block.get("name") or "", "arguments": args}})  # fmt: skip
        elif kind == "tool_result":
            tool_id = block.get("tool_use_id") or block.get("id") or ""
            if role == "user":
                out.extend(_flush(parts))
                out.append({"role": "tool", "tool_call_id": tool_id, "content": _text(block.get("content"))})
            else:
                parts.append({"type": "text", "text": f"Tool result: {_text(block.get('content'))}"})
    message: dict[str, Any] = {"role": role}
    if calls:
        message["tool_calls"] = calls
    if parts:
        message["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        out.append(message)
    elif calls:
        out.append(message)
    elif role != "user":
        out.append({**message, "content": ""})
    return out


def _flush(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not parts:
        return []
    content: Any = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else list(parts)
    parts.clear()
    return [{"role": "user", "content": content}]


def _tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Any:
    if not isinstance(choice, dict):
        return "auto" if tools else None
    kind = choice.get("type")
    if kind == "none":
        return "none"
    if kind in ("any", "tool") and not tools:
        raise MessagesError(f"tool_choice={kind!r} requires at least one custom tool")
    if kind == "any":
        return "required"
    if kind == "tool":
        name = choice.get("name")
        if not any(t["function"]["name"] == name for t in tools or []):
            raise MessagesError(f"tool_choice references tool {name!r} but it is not in the forwarded tools list")
        return {"type": "function", "function": {"name": name}}
    return "auto"


def usage(prompt: int, cached: int, output: int | None) -> dict[str, Any]:
    u: dict[str, Any] = {"input_tokens": max(prompt - cached, 0)}
    if output is not None:
        u["output_tokens"] = output
    if cached:
        u["cache_read_input_tokens"] = cached
    return u


def message(
    model: str,
    *,
    reasoning: str | None,
    text: str,
    tool_calls: list[dict[str, Any]] | None,
    finish: str,
    usage_: dict[str, Any],
) -> dict[str, Any]:
    """A non-streamed Messages response (``_convert_response``)."""
    content: list[dict[str, Any]] = []
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning})
    if text:
        content.append({"type": "text", "text": text})
    for call in tool_calls or []:
        content.append(tool_use_block(call, with_input=True))
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "content": content or [{"type": "text", "text": ""}],
        "model": model,
        "stop_reason": STOP_REASON.get(finish, "end_turn"),
        "usage": usage_,
    }


def tool_use_block(call: dict[str, Any], *, with_input: bool) -> dict[str, Any]:
    fn = call["function"]
    args: Any = {}
    if with_input:
        try:
            args = json.loads(fn["arguments"])
        except (json.JSONDecodeError, TypeError):
            args = {}
    return {"type": "tool_use", "id": call["id"], "name": fn["name"], "input": args}


def event(obj: dict[str, Any]) -> bytes:
    """One SSE event: ``event: TYPE`` then its JSON (``_wrap_sse_event``)."""
    kind: str = obj["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def message_start(msg_id: str, model: str, usage_: dict[str, Any]) -> bytes:
    body = {"id": msg_id, "type": "message", "role": "assistant", "content": [], "model": model, "usage": usage_}
    return event({"type": "message_start", "message": body})


class BlockStream:
    """Open, feed and close content blocks in order, each with its own index (SGLang's stream state)."""

    def __init__(self) -> None:
        self.index = 0
        self.open: str | None = None

    def ensure(self, kind: str, start: dict[str, Any], *, force_new: bool = False) -> list[bytes]:
        out: list[bytes] = []
        if self.open is not None and (force_new or self.open != kind):
            out.extend(self.close())
        if self.open is None:
            out.append(event({"type": "content_block_start", "index": self.index, "content_block": start}))
            self.open = kind
        return out

    def delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        out = [event({"type": "content_block_stop", "index": self.index})]
        self.open = None
        self.index += 1
        return out


def stream_end(finish: str, output_tokens: int) -> list[bytes]:
    return [
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": STOP_REASON.get(finish, "end_turn")},
                "usage": {"output_tokens": output_tokens},
            }
        ),
        event({"type": "message_stop"}),
    ]
