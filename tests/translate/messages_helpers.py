"""Shared pieces for the Anthropic Messages translation tests: a tool, a body, the follow-up turn, a check."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings

from gateway.surfaces.translate import messages as M
from tests.translate.chat import Turn

PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOL = {
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def body_for(**fields: Any) -> dict[str, Any]:
    return {"model": "kimi", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}], **fields}


def next_turn(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a follow-up that sends ``message`` back with one result per tool use."""
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": f"result of {b['id']}"}
        for b in message["content"]
        if b["type"] == "tool_use"
    ]
    follow = [{"role": "user", "content": "go"}, {"role": "assistant", "content": message["content"]}]
    if results:
        follow.append({"role": "user", "content": results})
    return M.to_chat(body_for(messages=follow)).chat["messages"][1:]


def assert_same_turn(messages: list[dict[str, Any]], turn: Turn) -> None:
    """The assistant turn rebuilt from Anthropic blocks says what the upstream said (arguments as
    JSON values: Anthropic carries ``input`` as an object, not the model's string)."""
    assistant = messages[0]
    assert assistant["content"] == turn.content
    assert assistant.get("reasoning_content", "") == turn.reasoning
    calls = [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant.get("tool_calls", [])
    ]
    assert calls == [(c.id, c.name, json.loads(c.arguments)) for c in turn.calls]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in messages[1:]] == [
        ("tool", c.id, f"result of {c.id}") for c in turn.calls
    ]
