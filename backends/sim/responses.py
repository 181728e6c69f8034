"""JSON bodies of SGLang 0.5.23's OpenAI-compatible responses, field for field.

Each function returns what SGLang serialises: pydantic ``model_dump_json`` for whole responses,
the usage chunk and completion chunks, and its msgspec ``StreamChunk`` (defaults omitted, except
``reasoning_content``) for chat content chunks. The fidelity tests validate them with SGLang's own
protocol models and check that a validate-then-dump round trip gives the same bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

KIMI_EOS_TOKEN_ID = 163586
"""``<|im_end|>``: what ``matched_stop`` reports when Kimi stops on its own."""


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> dict[str, Any]:
    """The flat ``ErrorResponse`` of 0.5.x chat and completions."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def usage(prompt: int, completion: int, cached: int, *, cache_report: bool, reasoning: int = 0) -> dict[str, Any]:
    """``UsageProcessor.calculate_*_usage`` (with ``--enable-cache-report`` when ``cache_report``)."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached} if cache_report else None,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chat_response(
    rid: str,
    created: int,
    model: str,
    *,
    content: str,
    reasoning: str | None,
    tool_calls: list[dict[str, Any]] | None,
    finish_reason: str,
    matched_stop: int | str | None,
    usage_: dict[str, Any],
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        message["tool_calls"] = _tool_calls(tool_calls)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched_stop,
            }
        ],
        "usage": usage_,
        "metadata": None,
    }


def chat_chunk(
    rid: str,
    created: int,
    model: str,
    *,
    role: str | None = None,
    content: str | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    matched_stop: int | str | None = None,
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``sse_utils.build_sse_content``: msgspec with omitted defaults, reasoning_content always present."""
    delta: dict[str, Any] = {"reasoning_content": reasoning}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    chunk: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "matched_stop": matched_stop}
        ],
    }
    if usage_ is not None:
        chunk["usage"] = usage_
    return chunk


def chat_tool_call_chunk(
    rid: str, created: int, model: str, tool_calls: list[dict[str, Any]], usage_: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``ChatCompletionStreamResponse`` carrying ``delta.tool_calls`` (pydantic dump)."""
    calls = _tool_calls(tool_calls)
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {"role": None, "content": None, "reasoning_content": None, "tool_calls": calls},
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
        ],
        "usage": usage_,
    }


def chat_usage_chunk(rid: str, created: int, model: str, usage_: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


def completion_response(
    rid: str,
    created: int,
    model: str,
    *,
    text: str,
    finish_reason: str,
    matched_stop: int | str | None,
    usage_: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "matched_stop": matched_stop}
        ],
        "usage": usage_,
        "metadata": None,
    }


def completion_chunk(
    rid: str,
    created: int,
    model: str,
    *,
    text: str,
    finish_reason: str | None,
    matched_stop: int | str | None,
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "matched_stop": matched_stop}
        ],
        "usage": usage_,
    }


def completion_usage_chunk(rid: str, created: int, model: str, usage_: dict[str, Any]) -> dict[str, Any]:
    """Dumped with ``exclude_none=True`` in 0.5.23."""
    u = {k: v for k, v in usage_.items() if v is not None}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [], "usage": u}


def _tool_calls(tool_calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kimi-style tool calls (``functions.NAME:i`` ids) in the OpenAI shape, with their index."""
    return [
        {
            "id": c["id"],
            "index": i,
            "type": "function",
            "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
        }
        for i, c in enumerate(tool_calls)
    ]
