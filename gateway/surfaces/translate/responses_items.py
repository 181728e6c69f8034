"""The output items of a Response (reasoning, message, function and custom calls), its usage and
its end state: the pieces ``responses.py`` (whole answers) and ``responses_stream.py`` (streams) build."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from gateway.surfaces.translate.common import ChatUsage, new_id
from gateway.surfaces.translate.responses_tools import custom_input

if TYPE_CHECKING:
    from gateway.surfaces.translate.responses import ResponsesRequest

_PACKED = "cg1:"


def pack_reasoning(text: str) -> str:
    """The reasoning trace as ``encrypted_content`` (not secret, only opaque to the client): a
    client that drops raw reasoning content on its next request still sends this back, so the
    model keeps its reasoning across a tool-call loop (Kimi's thinking models need it)."""
    return _PACKED + base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode()


def response_usage(usage: Any) -> dict[str, Any] | None:
    """Chat usage → Responses usage (``cached_tokens`` from ``prompt_tokens_details``)."""
    if not isinstance(usage, dict):
        return None
    u = ChatUsage.read(usage)
    return {
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": 0},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.prompt + u.completion,
    }


def incomplete_reason(finish_reason: Any) -> str | None:
    if finish_reason == "length":
        return "max_output_tokens"
    if finish_reason == "content_filter":
        return "content_filter"
    return None


def reasoning_item(item_id: str, text: str, wants_summary: bool, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "status": status,
        "summary": [{"type": "summary_text", "text": text}] if wants_summary else [],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": pack_reasoning(text),
    }


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def custom_call_item(item_id: str, call_id: str, name: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "type": "custom_tool_call", "call_id": call_id, "name": name, "input": text}


def response_object(
    req: ResponsesRequest,
    response_id: str,
    created_at: float,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Response object with the request's echoed fields (also the payload of lifecycle events)."""
    echo = req.echo
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "max_tool_calls": echo.get("max_tool_calls"),
        "metadata": echo.get("metadata") or {},
        "model": req.model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True) is not False,
        "previous_response_id": req.previous_response_id,
        "prompt_cache_key": echo.get("prompt_cache_key"),
        "reasoning": echo.get("reasoning"),
        "service_tier": echo.get("service_tier"),
        "store": req.store,
        "temperature": echo.get("temperature"),
        "text": echo.get("text") or {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice") or "auto",
        "tools": req.tools,
        "top_p": echo.get("top_p"),
        "truncation": echo.get("truncation") or "disabled",
        "usage": usage,
        "user": echo.get("user"),
    }


def from_chat(completion: dict[str, Any], req: ResponsesRequest, response_id: str, created_at: float) -> dict[str, Any]:
    """A non-streamed chat completion → the Response object."""
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    reason = incomplete_reason(choice.get("finish_reason"))
    status = "incomplete" if reason else "completed"
    output: list[dict[str, Any]] = []
    thinking = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(thinking, str) and thinking:
        output.append(reasoning_item(new_id("rs_"), thinking, req.wants_summary, status))
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(message_item(new_id("msg_"), text, status))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        name, arguments = str(fn.get("name") or ""), str(fn.get("arguments") or "")
        call_id = str(call.get("id") or new_id("call_"))
        if name in req.custom_tools:
            output.append(custom_call_item(new_id("ctc_"), call_id, name, custom_input(arguments)))
        else:
            output.append(function_call_item(new_id("fc_"), call_id, name, arguments, status))
    if not output:  # an empty answer is still one (empty) message, as the API gives
        output.append(message_item(new_id("msg_"), "", status))
    return response_object(
        req, response_id, created_at, status, output, response_usage(completion.get("usage")), reason
    )
