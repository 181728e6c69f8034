"""Anthropic Messages ⇄ chat completions: requests, checked with the Anthropic SDK's own types (whole
answers: test_messages_answers.py; streams: test_messages_stream.py; the error envelope:
test_messages_errors.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.errors import GatewayError
from gateway.surfaces.translate import messages as M
from tests.translate.messages_helpers import TOOL, body_for

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; cch=1f2e3;"


# ---- requests ----


def test_claude_code_shaped_request() -> None:
    body = body_for(
        system=[
            {"type": "text", "text": BILLING},
            {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                    {"type": "text", "text": "read a.py"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should read it.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "functions.read_file:0", "name": "read_file", "input": {"path": "a.py"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "functions.read_file:0",
                        "content": [{"type": "text", "text": "line1"}, {"type": "text", "text": "line2"}],
                    },
                    {"type": "text", "text": "now fix it"},
                ],
            },
        ],
        tools=[TOOL, {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        temperature=0.5,
        top_k=20,
        stream=True,
        thinking={"type": "enabled", "budget_tokens": 4000},
        metadata={"user_id": "user_x_session_abc"},
        context_management={"edits": [{"type": "clear_tool_uses_20250919"}]},
        betas=["x"],
        container=None,
    )
    req = M.to_chat(body)
    assert req.chat["messages"] == [
        {"role": "system", "content": "You are a coding agent."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": "read a.py"},
            ],
        },
        {
            "role": "assistant",
            "content": "Reading.",
            "reasoning_content": "I should read it.",
            "tool_calls": [
                {
                    "id": "functions.read_file:0",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "line1\nline2"},
        {"role": "user", "content": "now fix it"},
    ]
    assert req.chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "read_file", "parameters": TOOL["input_schema"], "description": "Read a file"},
        }
    ]
    assert (req.chat["tool_choice"], req.chat["parallel_tool_calls"]) == ("required", False)
    assert (req.chat["stop"], req.chat["top_k"], req.chat["max_tokens"], req.chat["stream"]) == (
        ["END"],
        20,
        1024,
        True,
    )
    assert req.session_hint == "user_x_session_abc" and req.stop_sequences == ["END"]
    assert "context_management" not in req.chat and "chat_template_kwargs" not in req.chat
    assert req.chat["stream_options"] == {"include_usage": True}


def test_images_errors_and_ordering() -> None:
    req = M.to_chat(
        body_for(
            system="plain",
            thinking={"type": "disabled"},
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}},
                        {"type": "text", "text": "before"},
                        {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t2",
                            "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}],
                        },
                    ],
                }
            ],
        )
    )
    assert req.chat["messages"] == [
        {"role": "system", "content": "plain"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}},
                {"type": "text", "text": "before"},
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"},
        {
            "role": "tool",
            "tool_call_id": "t2",
            "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}],
        },
    ]
    assert req.chat["chat_template_kwargs"] == {"thinking": False}


def test_an_inline_system_message_joins_the_system_prompt() -> None:
    """Claude Code sends a ``role: system`` message among the others; SGLang merges it into the
    system prompt, and so does the translation (never a 400)."""
    body = {
        "model": "kimi",
        "max_tokens": 10,
        "system": "You are Claude Code.",
        "messages": [{"role": "system", "content": "Today is Tuesday."}, {"role": "user", "content": "hi"}],
    }
    chat = M.to_chat(body).chat
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\nToday is Tuesday."},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"model": 3}, "model"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}]},
            "messages.0.content.0.source",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages.0.content.0"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"system": [{"type": "image"}]}, "system.0"),
    ],
)
def test_bad_requests_are_400_with_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        M.to_chat(body_for(**fields))
    assert err.value.status == 400 and err.value.param == param


def test_passthrough_body_loses_only_the_billing_header() -> None:
    body = body_for(system=[{"type": "text", "text": BILLING}, {"type": "text", "text": "keep"}])
    assert M.strip_billing_header(body)["system"] == [{"type": "text", "text": "keep"}]
    assert M.strip_billing_header(body_for(system=BILLING + "\nrest"))["system"] == "rest"
    plain = body_for(system="rest")
    assert M.strip_billing_header(plain) is plain


def test_count_tokens_follows_the_rendering_and_ratio() -> None:
    body = {"model": "kimi", "messages": [{"role": "user", "content": "x" * 4000}], "tools": [TOOL]}
    small = M.count_tokens(body, 0.25)["input_tokens"]
    assert 1000 < small < 1100
    assert M.count_tokens(body, 0.5)["input_tokens"] == pytest.approx(2 * small, abs=1)
    with_header = {**body, "system": [{"type": "text", "text": BILLING}]}
    assert M.count_tokens(with_header, 0.25)["input_tokens"] == small


# ---- the pieces ----


@pytest.mark.parametrize(
    ("choice", "tools", "chat_choice", "parallel"),
    [
        ({"type": "auto"}, [TOOL], "auto", None),
        ({"type": "none"}, [TOOL], "none", None),
        ({"type": "tool", "name": "read_file"}, [TOOL], {"type": "function", "function": {"name": "read_file"}}, None),
        ({"type": "auto", "disable_parallel_tool_use": True}, [TOOL], "auto", False),
        ({"type": "any"}, [{"type": "web_search_20250305", "name": "web_search"}], None, None),  # nothing to choose
        ({"type": "any"}, None, None, None),
    ],
)
def test_tool_choice(choice: dict[str, Any], tools: Any, chat_choice: Any, parallel: bool | None) -> None:
    chat = M.to_chat(body_for(tool_choice=choice, **({"tools": tools} if tools else {}))).chat
    assert chat.get("tool_choice") == chat_choice and chat.get("parallel_tool_calls") == parallel
    assert ("tools" in chat) == (chat_choice is not None)


def test_a_forced_tool_needs_its_name() -> None:
    with pytest.raises(GatewayError) as err:
        M.to_chat(body_for(tools=[TOOL], tool_choice={"type": "tool"}))
    assert err.value.param == "tool_choice.name"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream": "yes"}, "stream"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"temperature": True}, "temperature"),
        ({"top_p": "0.9"}, "top_p"),
        ({"tools": {"name": "x"}}, "tools"),
        ({"tools": [{"description": "no name"}]}, "tools.0"),
        ({"system": 5}, "system"),
        ({"messages": ["hi"]}, "messages.0"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]}]}, "messages.0.content.0"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "base64"}}]}]},
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 3}]}]},
            "messages.0.content.0.content",
        ),
    ],
)
def test_more_bad_requests(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        M.to_chat(body_for(**fields))
    assert err.value.status == 400 and err.value.param == param


def test_documents_references_and_error_results_with_parts() -> None:
    req = M.to_chat(
        body_for(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "document", "source": {"type": "text", "data": "DOC"}},
                        {"type": "tool_reference", "tool_name": "grep"},
                        {"type": "search_result", "text": "found"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "a"}, {"type": "thinking", "thinking": "b"}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "is_error": True,
                            "content": [{"type": "image", "source": {"type": "url", "url": "https://x/e.png"}}],
                        }
                    ],
                },
            ]
        )
    )
    assert req.chat["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "DOC"},
                {"type": "text", "text": "Tool reference: grep"},
                {"type": "text", "text": "found"},
            ],
        },
        {"role": "assistant", "content": "", "reasoning_content": "a\nb"},
        {
            "role": "tool",
            "tool_call_id": "t1",
            "content": [
                {"type": "text", "text": "Error:"},
                {"type": "image_url", "image_url": {"url": "https://x/e.png"}},
            ],
        },
    ]


def test_a_user_turn_of_only_thinking_is_an_empty_message_and_a_user_thinking_block_is_dropped() -> None:
    req = M.to_chat(body_for(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]))
    assert req.chat["messages"] == [{"role": "user", "content": ""}]


def test_counting_needs_no_max_tokens_and_adds_none() -> None:
    body = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}
    assert "max_tokens" not in M.to_chat(body, counting=True).chat
    with pytest.raises(GatewayError):
        M.to_chat(body)
    assert M.count_tokens(body, 0.0001) == {"input_tokens": 1}  # never zero


def test_the_billing_header_and_what_follows_it_in_the_same_block() -> None:
    both = BILLING + "\nYou are Claude Code."
    assert M.system_text([{"type": "text", "text": both}]) == "You are Claude Code."
    assert M.system_text(BILLING) == ""
    stripped = M.strip_billing_header(body_for(system=[{"type": "text", "text": both, "cache_control": {"x": 1}}]))
    assert stripped["system"] == [{"type": "text", "text": "You are Claude Code.", "cache_control": {"x": 1}}]
