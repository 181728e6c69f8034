"""Shared pieces for the Responses API translation tests: tools, a request, the follow-up turn, a check."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings

from gateway.surfaces.translate import responses as R
from tests.translate.chat import Turn

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}
PATCH_TOOL = {  # a custom (freeform) tool, as Codex's apply_patch
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" body'},
}


def req_for(**body: Any) -> R.ResponsesRequest:
    return R.to_chat({"model": "kimi", "input": "hi", **body})


def back_to_chat(output: list[dict[str, Any]], drop_raw: bool = False) -> list[dict[str, Any]]:
    """A follow-up turn's input: the previous output, then one result per function call.
    ``drop_raw``: resend reasoning items without their raw content, as Codex does."""
    if drop_raw:
        output = [{k: v for k, v in o.items() if k != "content"} if o["type"] == "reasoning" else o for o in output]
    results = [
        {"type": "function_call_output", "call_id": o["call_id"], "output": f"result of {o['call_id']}"}
        for o in output
        if o["type"] == "function_call"
    ]
    return R.to_chat({"model": "kimi", "input": [*output, *results]}).chat["messages"]


def assert_same_turn(message: dict[str, Any], turn: Turn) -> None:
    """The assistant message rebuilt from Responses items says exactly what the upstream said."""
    assert message["role"] == "assistant"
    assert message["content"] == turn.content
    assert message.get("reasoning_content", "") == turn.reasoning
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert calls == [(c.id, c.name, c.arguments) for c in turn.calls]
