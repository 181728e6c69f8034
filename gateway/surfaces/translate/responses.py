"""OpenAI Responses API ⇄ chat completions: the request, the non-streamed answer, the error envelope.

Request: ``instructions`` becomes the first system message; input items (after the prior items a
``previous_response_id`` resolved to) become chat messages: user/system/developer messages as they
are (developer → system), consecutive ``reasoning`` + assistant ``message`` + ``function_call``
items fold into one assistant message (``reasoning_content``, ``content``, ``tool_calls``), each
``function_call_output`` becomes a ``role: tool`` message. ``call_id`` is the chat tool-call id,
kept byte for byte (Kimi's ``functions.NAME:IDX``). Tools: see ``responses_tools`` (function tools
flattened, custom tools as one-string functions, hosted tools dropped).

Answer: ``reasoning_content`` → a ``reasoning`` item (raw text in ``content``; mirrored into
``summary`` when the request asked for ``reasoning.summary``, as SGLang does), ``content`` → a
``message`` item with one ``output_text`` part, each tool call → a ``function_call`` item (a
``custom_tool_call`` for a custom tool).
``finish_reason: length`` → ``status: incomplete``. Streaming lives in ``responses_stream``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from gateway.http.errors import error_body
from gateway.surfaces.translate.common import bad, read_upstream_error
from gateway.surfaces.translate.common import load_body as load_body
from gateway.surfaces.translate.responses_items import _PACKED as _PACKED
from gateway.surfaces.translate.responses_items import custom_call_item as custom_call_item
from gateway.surfaces.translate.responses_items import from_chat as from_chat
from gateway.surfaces.translate.responses_items import function_call_item as function_call_item
from gateway.surfaces.translate.responses_items import incomplete_reason as incomplete_reason
from gateway.surfaces.translate.responses_items import message_item as message_item
from gateway.surfaces.translate.responses_items import pack_reasoning as pack_reasoning
from gateway.surfaces.translate.responses_items import reasoning_item as reasoning_item
from gateway.surfaces.translate.responses_items import response_object as response_object
from gateway.surfaces.translate.responses_items import response_usage as response_usage
from gateway.surfaces.translate.responses_tools import chat_tool_choice, custom_arguments, read_tools

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_EFFORTS = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
# Fields of the request that the Response object repeats back.
_ECHO = (
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "previous_response_id",
    "reasoning",
    "temperature",
    "text",
    "tool_choice",
    "top_p",
    "truncation",
    "user",
    "store",
    "prompt_cache_key",
    "service_tier",
    "max_tool_calls",
)


@dataclass(slots=True)
class ResponsesRequest:
    """A Responses request translated for ``/v1/chat/completions``.

    ``chat`` is the upstream body (``model`` still the client's; fingerprint it with
    ``policies.prefix.request_fingerprint``), ``input_items`` the conversation so far in Responses
    shape (prior items + this request's input: what to store so a follow-up can continue it).
    """

    chat: dict[str, Any]
    input_items: list[dict[str, Any]]
    model: str
    stream: bool
    store: bool
    wants_summary: bool
    previous_response_id: str | None
    session_hint: str | None
    echo: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    custom_tools: frozenset[str] = frozenset()


def previous_response_id(body: dict[str, Any]) -> str | None:
    """The id whose stored items the caller must resolve before ``to_chat`` (None when absent)."""
    value = body.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad("'previous_response_id' must be a non-empty string.", "previous_response_id")
    return value


def to_chat(body: dict[str, Any], prior_items: list[dict[str, Any]] | None = None) -> ResponsesRequest:
    """Translate a Responses body (``prior_items``: the stored input + output items of
    ``previous_response_id``, resolved by the caller) into a chat completions body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a non-empty string.", "model")
    for name in ("background", "conversation", "prompt"):
        if body.get(name):
            raise bad(f"'{name}' is not supported by this gateway.", name, "unsupported_parameter")
    stream = _flag(body, "stream", False)
    store = _flag(body, "store", True)
    items = list(prior_items or []) + _input_items(body.get("input"))
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("'instructions' must be a string.", "instructions")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    messages += items_to_messages(items)
    if not messages:
        raise bad("'input' must contain at least one item.", "input")
    chat: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if stream:  # the translator reports usage from the last chunk; nothing is relayed raw
        chat["stream_options"] = {"include_usage": True}
    tools = read_tools(body.get("tools"))
    if tools.chat:
        chat["tools"] = tools.chat
        choice = chat_tool_choice(body.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
    max_out = body.get("max_output_tokens")
    if max_out is not None:
        if isinstance(max_out, bool) or not isinstance(max_out, int) or max_out < 1:
            raise bad("'max_output_tokens' must be a positive integer.", "max_output_tokens")
        chat["max_tokens"] = max_out
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise bad(f"'{name}' must be a number.", name)
            chat[name] = value
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = _flag(body, "parallel_tool_calls", True)
    reasoning = body.get("reasoning")
    wants_summary = isinstance(reasoning, dict) and reasoning.get("summary") is not None
    if isinstance(reasoning, dict):
        effort = reasoning.get("effort")
        if effort == "none":
            chat["chat_template_kwargs"] = {"thinking": False}
        elif effort in _EFFORTS:
            chat["reasoning_effort"] = _EFFORTS[effort]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt},
        }
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    hint = body.get("prompt_cache_key") or body.get("user")
    echo = {k: body[k] for k in _ECHO if k in body}
    return ResponsesRequest(
        chat,
        items,
        model,
        stream,
        store,
        wants_summary,
        previous_response_id(body),
        hint if isinstance(hint, str) else None,
        echo,
        tools.echo,
        tools.custom,
    )


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean.", name)
    return value


def _input_items(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    if not isinstance(value, list):
        raise bad("'input' must be a string or an array of items.", "input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad(f"'input[{i}]' must be an object.", f"input[{i}]")
    return list(value)


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items → chat messages (see the module docstring for the folding rules)."""
    messages: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being assembled

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            turn.setdefault("content", "")
            messages.append(turn)
            turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            content = _content(item.get("content"), f"{where}.content")
            if role == "assistant":
                if turn is None or "content" in turn or "tool_calls" in turn:
                    flush()
                    turn = {"role": "assistant"}
                turn["content"] = content
            elif role in ("user", "system", "developer"):
                flush()
                messages.append({"role": "system" if role == "developer" else role, "content": content})
            else:
                raise bad(f"'{where}.role' must be user, assistant, system or developer.", f"{where}.role")
        elif kind == "reasoning":
            text = reasoning_text(item)
            if turn is not None and ("content" in turn or "tool_calls" in turn):
                flush()
            if turn is None:
                turn = {"role": "assistant"}
            if text:
                previous = turn.get("reasoning_content")
                turn["reasoning_content"] = text if previous is None else previous + "\n\n" + text
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise bad(f"'{where}' needs string 'call_id' and 'name'.", where)
            arguments = item.get("arguments", "")
            if not isinstance(arguments, str):
                raise bad(f"'{where}.arguments' must be a string.", f"{where}.arguments")
            if turn is None:
                turn = {"role": "assistant"}
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "custom_tool_call":
            call_id, name, text = item.get("call_id"), item.get("name"), item.get("input", "")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(text, str):
                raise bad(f"'{where}' needs string 'call_id', 'name' and 'input'.", where)
            if turn is None:
                turn = {"role": "assistant"}
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": custom_arguments(text)}}
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad(f"'{where}.call_id' must be a string.", f"{where}.call_id")
            flush()
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _content(item.get("output"), f"{where}.output")}
            )
        else:
            raise bad(
                f"'{where}': input items of type {kind!r} are not supported by this gateway "
                "(supported: message, reasoning, function_call, function_call_output, custom_tool_call, "
                "custom_tool_call_output).",
                where,
            )
    flush()
    return messages


def reasoning_text(item: dict[str, Any]) -> str:
    """The text of a reasoning item: its raw ``content``, else the trace we packed into its
    ``encrypted_content`` (clients such as Codex resend only that and the summary), else its
    ``summary``."""
    parts = item.get("content")
    texts = (
        [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if isinstance(parts, list)
        else []
    )
    if texts:
        return "\n\n".join(texts)
    packed = item.get("encrypted_content")
    if isinstance(packed, str) and packed.startswith(_PACKED):
        try:
            return base64.urlsafe_b64decode(packed[len(_PACKED) :]).decode("utf-8", "surrogatepass")
        except (ValueError, UnicodeDecodeError):
            pass
    parts = item.get("summary")
    texts = (
        [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if isinstance(parts, list)
        else []
    )
    return "\n\n".join(texts)


def _content(value: Any, where: str) -> str | list[dict[str, Any]]:
    """Message content or a tool output → chat content: a string, or text/image parts."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(f"'{where}' must be a string or an array of content parts.", where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if part.get("detail") in ("low", "high", "auto"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise bad(
                f"'{where}[{j}]': content parts of type {kind!r} are not supported here "
                "(supported: input_text, output_text, refusal, input_image with image_url).",
                f"{where}[{j}]",
            )
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


# ---- the answer ----


def reshape_upstream_error(status: int, body: bytes | dict[str, Any] | str | None) -> tuple[int, bytes]:
    """An upstream error (SGLang's flat shape, OpenAI's, or text) → OpenAI's envelope, status kept."""
    err = read_upstream_error(status, body)
    return err.status, error_body(err.status, err.message, err.code, err.param)
