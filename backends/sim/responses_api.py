"""SGLang 0.5.23's OpenAI Responses API, as data (``openai/serving_responses.py``): input items turned
into the chat messages SGLang renders, the response object with its output items, its SSE events
and the response store behind ``previous_response_id`` and ``GET /v1/responses/{id}``.

Ids as SGLang makes them: ``resp_<hex>`` responses, ``rs_``/``msg_`` items, ``fc_`` function-call
items whose ``call_id`` is ``call_<24 hex>``. Usage: ``input_tokens``,
``input_tokens_details.cached_tokens`` (and ``cache_write_tokens: 0``), ``output_tokens``,
``output_tokens_details.reasoning_tokens``, ``total_tokens``. An answer cut by
``max_output_tokens`` has status ``incomplete`` with ``incomplete_details.reason``.
"""

from __future__ import annotations

import base64
import time
import uuid
import zlib
from collections import OrderedDict
from typing import Any

import orjson

STORE_LIMIT = 4096
"""Responses kept for ``previous_response_id`` and retrieval (oldest dropped first)."""


class ResponsesError(ValueError):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


def error_body(e: ResponsesError) -> dict[str, Any]:
    err_type = "invalid_request_error" if e.status in (400, 404) else "BadRequestError"
    return {"object": "error", "message": e.message, "type": err_type, "param": e.param, "code": e.status}


def new_id(prefix: str, n: int = 32) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:n]}"


class Store:
    """Finished responses and the item history each one ends (SGLang's ``response_store`` and
    ``msg_store``), bounded."""

    def __init__(self, limit: int = STORE_LIMIT) -> None:
        self.limit = limit
        self.responses: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.history: dict[str, list[Any]] = {}

    def put(self, response: dict[str, Any], history: list[Any]) -> None:
        rid = response["id"]
        self.responses[rid] = response
        self.history[rid] = history
        while len(self.responses) > self.limit:
            old, _ = self.responses.popitem(last=False)
            self.history.pop(old, None)

    def get(self, response_id: str) -> dict[str, Any]:
        if not response_id.startswith("resp_"):
            raise ResponsesError(
                f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.",
                param="response_id",
            )
        found = self.responses.get(response_id)
        if found is None:
            raise ResponsesError(f"Response with id '{response_id}' not found.", 404, "response_id")
        return found


def input_history(body: dict[str, Any], store: Store) -> list[Any]:
    """Earlier items (``previous_response_id``) followed by this request's input."""
    prev = body.get("previous_response_id")
    history = list(store.history[store.get(prev)["id"]]) if prev is not None else []
    raw = body.get("input", [])
    if isinstance(raw, str):
        history.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        history.extend(raw)
    else:
        raise ResponsesError("input: Input should be a valid string or list", param="input")
    return history


def to_messages(instructions: Any, history: list[Any]) -> list[dict[str, Any]]:
    """Chat messages for the items (``_construct_input_messages``), consecutive assistant items
    (a message and its function calls) merged into one turn."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": str(instructions)})
    for item in history:
        msg = _to_message(item)
        if msg is None:
            continue
        prev = messages[-1] if messages else None
        if msg["role"] == "assistant" and prev is not None and prev["role"] == "assistant":
            if msg.get("content"):
                prev["content"] = (prev.get("content") or "") + msg["content"]
            prev["tool_calls"] = [*(prev.get("tool_calls") or []), *(msg.get("tool_calls") or [])]
            continue
        messages.append(msg)
    return messages


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _to_message(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        raise ResponsesError("input: each item must be an object", param="input")
    kind = item.get("type")
    if kind == "function_call":
        call = {"id": item.get("call_id") or item.get("id") or "", "type": "function",
                "function": {"name": item.get("name") or "", "arguments": item.get("arguments") or "{}"}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output", "")
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": _content_text(output)}
    if kind == "reasoning":
        return None  # Kimi's template drops earlier reasoning
    role = item.get("role")
    if role is None:
        return None
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant"):
        raise ResponsesError(f"input: unsupported role {role!r}", param="input")
    return {"role": role, "content": _content_text(item.get("content"))}


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Function tools as chat tools (others, such as ``web_search``, have no chat equivalent)."""
    out = []
    for tool in tools or []:
        if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("name"):
            fn = {"name": tool["name"], "description": tool.get("description") or "",
                  "parameters": tool.get("parameters") or {}}  # fmt: skip
            out.append({"type": "function", "function": fn})
    return out


def usage(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def response(
    body: dict[str, Any], rid: str, created: int, model: str, output: list[dict[str, Any]], status: str,
    usage_: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    """``ResponsesResponse.from_request``, dumped."""
    text_only = bool(output) and all(i["type"] == "message" for i in output)
    raw = body.get("reasoning")
    reasoning: dict[str, Any] = raw if isinstance(raw, dict) else {}
    effort = reasoning.get("effort") if reasoning.get("effort") in ("low", "medium", "high") else None
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "output": output,
        "status": status,
        "usage": usage_,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": effort, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature"),
        "text": body.get("text") or ({"format": {"type": "text"}} if text_only else None),
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


REASONING_STATE_PREFIX = "sglang-reasoning-v1."


def wants_encrypted_reasoning(body: dict[str, Any]) -> bool:
    """``include: ["reasoning.encrypted_content"]`` (Codex sends it, with ``store: false``)."""
    include = body.get("include")
    return isinstance(include, list) and "reasoning.encrypted_content" in include


def reasoning_item(item_id: str, text: str, status: str, summary: bool, encrypted: bool = False) -> dict[str, Any]:
    """A reasoning item; ``encrypted`` packs the trace as SGLang's ``encode_reasoning_state`` does
    (zlib + urlsafe base64 behind a prefix: encoded, not protected)."""
    done = status == "completed"
    blob = REASONING_STATE_PREFIX + base64.urlsafe_b64encode(zlib.compress(text.encode())).decode()
    return {
        "id": item_id,
        "summary": [{"text": text, "type": "summary_text"}] if summary and done else [],
        "type": "reasoning",
        "content": [{"text": text, "type": "reasoning_text"}] if done else [],
        "encrypted_content": blob if encrypted and done else None,
        "status": status,
    }


def output_text(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [output_text(text)] if status == "completed" else []
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message",
            "phase": "final_answer"}  # fmt: skip


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"arguments": arguments, "call_id": call_id, "name": name, "type": "function_call", "id": item_id,
            "status": status}  # fmt: skip


class EventWriter:
    """``event: TYPE`` + JSON with a running ``sequence_number`` (SGLang's ``_send_event``)."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def now() -> int:
    return int(time.time())
