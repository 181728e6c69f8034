"""backends/sim/anthropic.py: a Messages request turned into the chat request SGLang 0.5.23 builds
(system prompt, content blocks, tool use and results, tools, ``tool_choice``, thinking), and the chat
result shaped back into Anthropic's message, SSE events, usage and errors; the shapes validated with
SGLang's own Anthropic models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from backends.sim import anthropic as A
from backends.sim import sglang_ref

AP = sglang_ref.load_anthropic_protocol()
READ = {"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}
CALL = {"id": "functions.Read:0", "type": "function", "function": {"name": "Read", "arguments": '{"file_path": "a"}'}}


def _chat(**body: Any) -> dict[str, Any]:
    return A.to_chat({"model": "kimi", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **body})


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"messages": [], "max_tokens": 1}, "model: Field required"),
        ({"model": "k", "max_tokens": 1}, "messages: Field required"),
        ({"model": "k", "messages": []}, "max_tokens: Field required"),
        ({"model": "k", "messages": "hi", "max_tokens": 1}, "valid list"),
        ({"model": "k", "messages": [{"role": "tool", "content": "x"}], "max_tokens": 1}, "role of user or assistant"),
        ({"model": "k", "messages": [{"role": "user", "content": 5}], "max_tokens": 1}, "valid string or list"),
    ],
)
def test_a_request_sglang_cannot_convert_is_refused(body: dict[str, Any], match: str) -> None:
    with pytest.raises(A.MessagesError, match=match):
        A.to_chat(body)


def test_system_text_from_the_field_and_from_system_messages_becomes_one_system_message() -> None:
    chat = A.to_chat(
        {
            "model": "kimi",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be a CLI."}, {"type": "text", "text": ""}, {"type": "image"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": " Working directory: /srv "}]},
                {"role": "system", "content": "   "},
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Be a CLI.\nWorking directory: /srv"},
        {"role": "user", "content": "hi"},
    ]
    assert chat["model"] == "kimi" and chat["max_tokens"] == 5 and chat["tool_choice"] is None
    assert chat["thinking"] is False
    assert _chat(system="   ")["messages"][0]["role"] == "user"  # a blank system prompt is none


def test_tool_use_and_tool_results_become_chat_tool_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "functions.Read:0", "name": "Read", "input": {"file_path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "before"},
                {"type": "tool_result", "tool_use_id": "functions.Read:0", "content": [{"type": "text", "text": "x"}]},
                {"type": "text", "text": "after"},
                {"type": "image", "source": {}},
            ],
        },
    ]
    chat = _chat(messages=messages)
    assert chat["messages"] == [
        {"role": "user", "content": "look"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "functions.Read:0",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "a"}'},
                },
            ],
        },
        {"role": "user", "content": "before"},
        {"role": "tool", "tool_call_id": "functions.Read:0", "content": "x"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "after"}, {"type": "image_url", "image_url": {"url": "image"}}],
        },
    ]


def test_odd_assistant_turns() -> None:
    calls_only = _chat(messages=[{"role": "assistant", "content": [{"type": "tool_use", "name": "Read"}]}])
    msg = calls_only["messages"][0]
    assert "content" not in msg and msg["tool_calls"][0]["id"].startswith("call_")
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {}
    assert _chat(messages=[{"role": "assistant", "content": []}])["messages"] == [{"role": "assistant", "content": ""}]
    assert _chat(messages=[{"role": "user", "content": []}])["messages"] == []
    result = [{"type": "tool_result", "tool_use_id": "t", "content": "done"}]
    assert _chat(messages=[{"role": "assistant", "content": result}])["messages"] == [
        {"role": "assistant", "content": "Tool result: done"}
    ]
    with pytest.raises(A.MessagesError, match="redacted_thinking"):
        _chat(messages=[{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}])


def test_custom_tools_are_forwarded_and_server_tools_dropped() -> None:
    chat = _chat(tools=[READ, {"type": "web_search_20250305", "name": "web_search"}, {"type": "custom", "name": "X"}])
    assert [t["function"]["name"] for t in chat["tools"]] == ["Read", "X"]
    assert chat["tools"][0]["function"] == {
        "name": "Read",
        "description": "Read a file",
        "parameters": {"type": "object"},
    }
    assert chat["tool_choice"] == "auto"
    assert "tools" not in _chat(tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert A.is_server_tool({"type": "bash_20250124"}) and not A.is_server_tool({"name": "Read"})


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "Read"}, {"type": "function", "function": {"name": "Read"}}),
    ],
)
def test_tool_choice_is_mapped_to_chats(choice: dict[str, Any], expected: Any) -> None:
    assert _chat(tools=[READ], tool_choice=choice)["tool_choice"] == expected


def test_a_tool_choice_that_names_no_forwarded_tool_is_refused() -> None:
    with pytest.raises(A.MessagesError, match="requires at least one custom tool"):
        _chat(tool_choice={"type": "any"})
    with pytest.raises(A.MessagesError, match="'Write' but it is not in the forwarded tools"):
        _chat(tools=[READ], tool_choice={"type": "tool", "name": "Write"})


def test_thinking_is_on_unless_absent_or_disabled() -> None:
    assert _chat(thinking={"type": "enabled", "budget_tokens": 1024})["thinking"] is True
    assert _chat(thinking={"type": "disabled"})["thinking"] is False
    assert _chat()["thinking"] is False


def test_usage_counts_cached_tokens_apart_from_the_input() -> None:
    assert A.usage(100, 64, 7) == {"input_tokens": 36, "output_tokens": 7, "cache_read_input_tokens": 64}
    assert A.usage(100, 0, None) == {"input_tokens": 100}
    assert A.usage(10, 20, 0)["input_tokens"] == 0


def test_a_whole_message_with_thinking_text_and_a_tool_use() -> None:
    msg = A.message(
        "kimi", reasoning="why", text="Reading.", tool_calls=[CALL], finish="tool_calls", usage_=A.usage(10, 0, 3)
    )
    assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
    assert msg["content"][2] == {
        "type": "tool_use",
        "id": "functions.Read:0",
        "name": "Read",
        "input": {"file_path": "a"},
    }
    assert msg["stop_reason"] == "tool_use" and msg["id"].startswith("msg_")
    AP.AnthropicMessagesResponse.model_validate({**msg, "content": msg["content"][1:]})
    empty = A.message("kimi", reasoning=None, text="", tool_calls=None, finish="abort", usage_=A.usage(1, 0, 0))
    assert empty["content"] == [{"type": "text", "text": ""}] and empty["stop_reason"] == "end_turn"
    cut = A.message("k", reasoning=None, text="x", tool_calls=None, finish="length", usage_={})
    assert cut["stop_reason"] == "max_tokens"


def test_tool_use_input_that_is_no_json_is_empty() -> None:
    broken = {**CALL, "function": {"name": "Read", "arguments": "{not json"}}
    assert A.tool_use_block(broken, with_input=True)["input"] == {}
    assert A.tool_use_block(CALL, with_input=False)["input"] == {}


def _decode(raw: bytes) -> tuple[str, dict[str, Any]]:
    head, data = raw.decode().rstrip("\n").split("\n")
    return head.removeprefix("event: "), json.loads(data.removeprefix("data: "))


def test_block_stream_numbers_blocks_and_closes_one_before_opening_the_next() -> None:
    blocks = A.BlockStream()
    out = blocks.ensure("thinking", {"type": "thinking", "thinking": ""})
    out += blocks.ensure("thinking", {"type": "thinking", "thinking": ""})  # already open: nothing
    out.append(blocks.delta({"type": "thinking_delta", "thinking": "hm"}))
    out += blocks.ensure("text", {"type": "text", "text": ""})
    out += blocks.ensure("tool_use", A.tool_use_block(CALL, with_input=False), force_new=True)
    out += blocks.ensure("tool_use", A.tool_use_block(CALL, with_input=False), force_new=True)
    out += blocks.close() + blocks.close()
    events = [_decode(e) for e in out]
    assert [(k, d.get("index")) for k, d in events] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_stop", 2),
        ("content_block_start", 3),
        ("content_block_stop", 3),
    ]
    adapter = AP.AnthropicStreamEvent
    for kind, data in events:
        assert data["type"] == kind
        _validate(adapter, data)


def test_the_stream_starts_with_message_start_and_ends_with_its_stop_reason() -> None:
    kind, start = _decode(A.message_start("msg_1", "kimi", A.usage(10, 4, 0)))
    assert kind == "message_start" and start["message"]["usage"] == {
        "input_tokens": 6,
        "output_tokens": 0,
        "cache_read_input_tokens": 4,
    }
    end = [_decode(e) for e in A.stream_end("length", 12)]
    assert end == [
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 12}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    for _, data in [(kind, start), *end]:
        _validate(AP.AnthropicStreamEvent, data)


def test_error_bodies_use_anthropics_types() -> None:
    assert A.error_body("bad") == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert A.error_body("slow", 503)["error"]["type"] == "overloaded_error"
    assert A.error_body("odd", 418)["error"]["type"] == "api_error"


def _validate(annotation: Any, data: dict[str, Any]) -> None:
    TypeAdapter(annotation).validate_python(data)
