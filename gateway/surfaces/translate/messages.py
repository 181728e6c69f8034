"""Anthropic Messages API ⇄ chat completions: the request, the non-streamed answer, errors, counting.

Request: ``system`` (a string or text blocks) becomes the first system message, minus Claude
Code's ``x-anthropic-billing-header`` block (its ``cch=`` changes on every request and would make
every prompt's prefix new to the engine's cache); ``text`` / ``image`` blocks become chat parts
(images as ``image_url`` data URIs); an assistant's ``thinking`` blocks become its
``reasoning_content`` (``redacted_thinking`` is opaque and dropped); ``tool_use`` blocks become
``tool_calls`` (id intact, ``input`` as JSON); each ``tool_result`` becomes a ``role: tool``
message (an ``is_error`` result is prefixed ``Error: `` so the model knows). Tools map
``input_schema`` → ``parameters``; server tools (``web_search_…``, ``bash_…``) have nothing to run
them behind a chat backend and are dropped. Unknown top-level fields (``context_management``,
``betas``, ``container``, …) are ignored, never refused.

Answer: ``reasoning_content`` → a ``thinking`` block (its ``signature`` a digest of the text, so it
is stable and non-empty), ``content`` → a ``text`` block, each tool call → a ``tool_use`` block
with the chat id kept intact. Streaming lives in ``messages_stream``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gateway.surfaces.translate.common import ChatUsage, bad, parse_arguments
from gateway.surfaces.translate.common import load_body as load_body
from gateway.surfaces.translate.messages_errors import CODE_ERROR_TYPES as CODE_ERROR_TYPES
from gateway.surfaces.translate.messages_errors import ERROR_TYPES as ERROR_TYPES
from gateway.surfaces.translate.messages_errors import error_body as error_body
from gateway.surfaces.translate.messages_errors import error_envelope as error_envelope
from gateway.surfaces.translate.messages_errors import error_type as error_type
from gateway.surfaces.translate.messages_errors import reshape_upstream_error as reshape_upstream_error
from policies.prefix import render_chat

BILLING_HEADER = "x-anthropic-billing-header:"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}
_TEXTUAL = ("text", "search_result", "document")


@dataclass(slots=True)
class MessagesRequest:
    """A Messages request translated for ``/v1/chat/completions`` (``chat['model']`` still the
    client's; fingerprint ``chat`` with ``policies.prefix.request_fingerprint``)."""

    chat: dict[str, Any]
    model: str
    stream: bool
    stop_sequences: list[str]
    session_hint: str | None  # metadata.user_id: Claude Code puts its session id there


def to_chat(body: dict[str, Any], *, counting: bool = False) -> MessagesRequest:
    """Translate a Messages body (``counting``: a count_tokens body, which has no ``max_tokens``)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model: Field required (a non-empty string).", "model")
    max_tokens = body.get("max_tokens")
    if not counting and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad("max_tokens: Field required (a positive integer).", "max_tokens")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("stream: must be a boolean.", "stream")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise bad("messages: Field required (a non-empty array).", "messages")
    messages: list[dict[str, Any]] = []
    system_parts = [system_text(body.get("system"))]
    for i, message in enumerate(raw_messages):
        if isinstance(message, dict) and message.get("role") == "system":
            # Claude Code sends one inline; SGLang merges it into the system prompt, and so do we
            system_parts.append(system_text(message.get("content")))
            continue
        messages += _message(message, f"messages.{i}")
    system = "\n".join(p for p in system_parts if p)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    chat: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if stream:  # the translator reports usage from the last chunk; nothing is relayed raw
        chat["stream_options"] = {"include_usage": True}
    if not counting:
        chat["max_tokens"] = max_tokens
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat)
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop_sequences: must be an array of strings.", "stop_sequences")
    if stops:
        chat["stop"] = stops
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise bad(f"{name}: must be a number.", name)
            chat[name] = value
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["chat_template_kwargs"] = {"thinking": False}  # Kimi's template switch
    metadata = body.get("metadata")
    hint = metadata.get("user_id") if isinstance(metadata, dict) else None
    return MessagesRequest(chat, model, stream, stops, hint if isinstance(hint, str) else None)


def system_text(system: Any) -> str:
    """The system prompt as one string, without Claude Code's per-request billing header."""
    if system is None:
        return ""
    if isinstance(system, str):
        return _strip_billing(system)
    if not isinstance(system, list):
        raise bad("system: must be a string or an array of text blocks.", "system")
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad(f"system.{j}: must be a text block.", f"system.{j}")
        text = _strip_billing(block["text"])
        if text:
            texts.append(text)
    return "\n".join(texts)


def _strip_billing(text: str) -> str:
    if not text.startswith(BILLING_HEADER):
        return text
    _, _, rest = text.partition("\n")
    return rest


def strip_billing_header(body: dict[str, Any]) -> dict[str, Any]:
    """The body with the billing-header system block removed (for passthrough to a backend that
    serves ``/v1/messages`` itself: the same cache argument)."""
    system = body.get("system")
    if isinstance(system, str) and system.startswith(BILLING_HEADER):
        return {**body, "system": _strip_billing(system)}
    if isinstance(system, list) and any(
        isinstance(b, dict) and str(b.get("text", "")).startswith(BILLING_HEADER) for b in system
    ):
        kept = [
            b
            for b in system
            if not (
                isinstance(b, dict)
                and str(b.get("text", "")).startswith(BILLING_HEADER)
                and not _strip_billing(b["text"])
            )
        ]
        kept = [
            {**b, "text": _strip_billing(b["text"])} if isinstance(b, dict) and isinstance(b.get("text"), str) else b
            for b in kept
        ]
        return {**body, "system": kept}
    return body


def _message(message: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        raise bad(f"{where}: must be an object.", where)
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise bad(f"{where}.role: must be 'user' or 'assistant'.", f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad(f"{where}.content: must be a string or an array of blocks.", f"{where}.content")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in ("thinking", "redacted_thinking"):
            if kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad(f"{at}: tool_use needs string 'id' and 'name'.", at)
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False),
                    },
                }
            )
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad(f"{at}.tool_use_id: Field required.", f"{at}.tool_use_id")
            if parts:  # keep the wire order: text that came before this result goes before it
                out.append({"role": "user", "content": _joined(parts)})
                parts = []
            result = _result_content(block.get("content"), at)
            if block.get("is_error") is True:
                result = (
                    "Error: " + result if isinstance(result, str) else [{"type": "text", "text": "Error:"}, *result]
                )
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        else:
            parts.append(_part(block, at))
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": _joined(parts) if parts else ""}
        if thinking:
            turn["reasoning_content"] = "\n".join(thinking)
        if calls:
            turn["tool_calls"] = calls
        return [turn]
    if parts or not out:
        out.append({"role": "user", "content": _joined(parts) if parts else ""})
    return out


def _part(block: Any, at: str) -> dict[str, Any]:
    """A text-like or image block → a chat content part."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "image":
        source = block.get("source") or {}
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            url = f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
        elif source.get("type") == "url" and isinstance(source.get("url"), str):
            url = source["url"]
        else:
            raise bad(f"{at}.source: images need a base64 or url source.", f"{at}.source")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "document" and isinstance(block.get("source"), dict):
        source = block["source"]
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return {"type": "text", "text": source["data"]}
        raise bad(f"{at}: only text documents are supported by this gateway.", at)
    if kind == "tool_reference" and isinstance(block.get("tool_name") or block.get("name"), str):
        return {"type": "text", "text": f"Tool reference: {block.get('tool_name') or block.get('name')}"}
    if isinstance(block, dict) and isinstance(block.get("text"), str) and kind in (*_TEXTUAL, None):
        return {"type": "text", "text": block["text"]}
    raise bad(f"{at}: content blocks of type {kind!r} are not supported here.", at)


def _joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _result_content(content: Any, at: str) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{at}.content: must be a string or an array of blocks.", f"{at}.content")
    parts = [_part(block, f"{at}.content.{k}") for k, block in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools: must be an array.", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad(f"tools.{i}: needs a string 'name'.", f"tools.{i}")
        if "input_schema" not in tool:
            continue  # a server tool (web_search_…, bash_…): no backend here can run it
        fn: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise bad("tool_choice: type must be auto, any, tool or none.", "tool_choice")
    if not chat.get("tools"):
        return  # nothing to choose from (every tool was a server tool, or none was given)
    if kind == "none":
        chat["tool_choice"] = "none"
        return
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad("tool_choice.name: Field required.", "tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = "required" if kind == "any" else "auto"


# ---- the answer ----


def signature(thinking: str) -> str:
    """A thinking block's signature: clients require a non-empty string and send it back; nothing
    verifies it here, so a digest of the text (the same streamed or not)."""
    return "cg1:" + hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def usage_of(usage: Any) -> dict[str, int]:
    """Chat usage → Anthropic usage: ``input_tokens`` counts only what the cache did not hold."""
    u = ChatUsage.read(usage)
    return {
        "input_tokens": u.prompt - u.cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached,
        "output_tokens": u.completion,
    }


def stop_reason(
    finish_reason: Any, matched_stop: Any, stop_sequences: list[str], has_tool_calls: bool
) -> tuple[str | None, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat ``finish_reason`` (and SGLang's ``matched_stop``)."""
    if finish_reason is None:
        return None, None
    if has_tool_calls and finish_reason in ("stop", "tool_calls"):
        return "tool_use", None
    if finish_reason == "stop" and isinstance(matched_stop, str) and matched_stop in stop_sequences:
        return "stop_sequence", matched_stop
    return STOP_REASONS.get(str(finish_reason), "end_turn"), None


def from_chat(completion: dict[str, Any], req: MessagesRequest, message_id: str) -> dict[str, Any]:
    """A non-streamed chat completion → the Message object."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    thinking = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thinking, str) and thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls") or []
    for call in calls:
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(fn.get("name") or ""),
                "input": parse_arguments(str(fn.get("arguments") or "")),
            }
        )
    reason, sequence = stop_reason(
        choice.get("finish_reason") or "stop", choice.get("matched_stop"), req.stop_sequences, bool(calls)
    )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(completion.get("usage")),
    }


def count_tokens(body: dict[str, Any], tokens_per_byte: float) -> dict[str, int]:
    """``/v1/messages/count_tokens``: the input tokens of a Messages body, estimated from the size
    of its chat rendering (``policies.prefix.render_chat``) times the gateway's learned ratio
    (``policies.tokens.TokenEstimator.ratio``, tokens per byte)."""
    req = to_chat(body, counting=True)
    return {"input_tokens": max(1, round(len(render_chat(req.chat)) * tokens_per_byte))}


# ---- errors ----
