"""``backends/sim/chat_template.py``: the twin's Kimi-style chat template: its markup per role, tools and
tool calls, the generation prompt, continuing a trailing assistant message, the errors SGLang answers
400 to, and the append-only rule (turn N + 1's prompt starts with turn N's prompt and answer)."""

from __future__ import annotations

import json

import pytest

from backends.sim.chat_template import (
    ASSISTANT_HEADER,
    END,
    TemplateError,
    assistant_text,
    content_text,
    render_chat,
    render_message,
    tool_calls_text,
)

CALL = {"id": "functions.read:0", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}


def test_each_role_has_its_markup() -> None:
    assert render_message({"role": "user", "content": "hi"}) == "<|im_user|>user<|im_middle|>hi<|im_end|>"
    assert render_message({"role": "system", "content": "s"}) == "<|im_system|>system<|im_middle|>s<|im_end|>"
    assert render_message({"role": "developer", "content": "d"}) == "<|im_system|>system<|im_middle|>d<|im_end|>"
    assert render_message({"role": "tool", "tool_call_id": "functions.read:0", "content": "x"}) == (
        "<|im_system|>functions.read:0<|im_middle|>x<|im_end|>"
    )
    assert render_message({"role": "tool", "content": "x"}).startswith("<|im_system|>tool<|im_middle|>")
    assistant = {"role": "assistant", "content": "ok", "reasoning_content": "dropped", "tool_calls": [CALL]}
    assert render_message(assistant) == ASSISTANT_HEADER + "ok" + tool_calls_text([CALL]) + END


def test_content_parts_and_media_markers() -> None:
    parts = ["a", {"type": "text", "text": "b"}, {"type": "image_url", "image_url": {"url": "x"}}, {"text": "?"}]
    assert content_text(parts) == "ab<|media:image_url|><|media:unknown|>"
    assert content_text(None) == "" and content_text("plain") == "plain"
    with pytest.raises(TemplateError, match="Invalid content part"):
        content_text([3])
    with pytest.raises(TemplateError, match="Invalid message content"):
        content_text({"type": "text"})


def test_tool_call_markup_with_string_or_object_arguments() -> None:
    assert tool_calls_text([]) == ""
    text = tool_calls_text([CALL, {"id": "functions.ls:1", "function": {"arguments": {"b": 1, "a": 2}}}])
    assert text == (
        "<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.read:0<|tool_call_argument_begin|>{"path": "a"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.ls:1<|tool_call_argument_begin|>{"a": 2, "b": 1}<|tool_call_end|>'
        "<|tool_calls_section_end|>"
    )
    assert assistant_text("x") == "x" and assistant_text("x", [CALL]) == "x" + tool_calls_text([CALL])


def test_tools_come_first_and_the_prompt_ends_with_the_assistant_header() -> None:
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"b": 1, "a": 2}}}]
    prompt = render_chat([{"role": "user", "content": "hi"}], tools)
    declared = f"<|im_system|>tool_declare<|im_middle|>{json.dumps(tools, sort_keys=True)}{END}"
    assert prompt == declared + "<|im_user|>user<|im_middle|>hi<|im_end|>" + ASSISTANT_HEADER
    bare = render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert not bare.endswith(ASSISTANT_HEADER)


def test_a_trailing_assistant_message_is_continued_open() -> None:
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    assert render_chat(msgs, add_generation_prompt=False).endswith(ASSISTANT_HEADER + "Sure, ")
    assert render_chat(msgs).endswith(ASSISTANT_HEADER + "Sure, " + END + ASSISTANT_HEADER)


def test_messages_the_template_cannot_render() -> None:
    with pytest.raises(TemplateError, match="needs a role"):
        render_chat([{"content": "x"}])
    with pytest.raises(TemplateError, match="needs a role"):
        render_chat(["x"])  # type: ignore[list-item]
    with pytest.raises(TemplateError, match="Unsupported message role: robot"):
        render_chat([{"role": "robot", "content": "x"}])
    assert issubclass(TemplateError, ValueError)
    assert render_chat([]) == ASSISTANT_HEADER


def test_the_next_turn_starts_with_the_previous_prompt_and_answer() -> None:
    turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list files"}]
    prompt1 = render_chat(turn1)
    answer = assistant_text("", [CALL])
    turn2 = [*turn1, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    turn2.append({"role": "tool", "tool_call_id": "functions.read:0", "content": "README.md"})
    assert render_chat(turn2).startswith(prompt1 + answer)
