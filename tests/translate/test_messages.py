"""Anthropic Messages ⇄ chat completions: requests, whole answers and errors, checked with the Anthropic
SDK's own types (streams: test_messages_stream.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from anthropic.types import Message
from anthropic.types.shared import ErrorResponse
from hypothesis import given

from gateway.http.errors import GatewayError
from gateway.surfaces.translate import messages as M
from tests.translate.chat import Turn, turns
from tests.translate.messages_helpers import PROPS, TOOL, assert_same_turn, body_for, next_turn

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


# ---- answers ----


@PROPS
@given(turns())
def test_non_streamed_answer_round_trips(turn: Turn) -> None:
    req = M.to_chat(body_for(tools=[TOOL]))
    message = M.from_chat(turn.completion(), req, "msg_x")
    parsed = Message.model_validate(message)
    expected = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[turn.finish]
    assert parsed.stop_reason == expected
    cached = turn.usage["prompt_tokens_details"]["cached_tokens"]
    assert parsed.usage.input_tokens == turn.usage["prompt_tokens"] - cached
    assert (parsed.usage.cache_read_input_tokens, parsed.usage.cache_creation_input_tokens) == (cached, 0)
    assert parsed.usage.output_tokens == turn.usage["completion_tokens"]
    assert_same_turn(next_turn(message), turn)


# ---- errors ----


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (400, None, "invalid_request_error"),
        (401, None, "authentication_error"),
        (403, None, "permission_error"),
        (404, None, "not_found_error"),
        (413, None, "request_too_large"),
        (429, "team_queue_full", "rate_limit_error"),
        (429, "team_token_rate", "rate_limit_error"),
        (503, "queue_timeout", "overloaded_error"),
        (503, "no_healthy_backend", "overloaded_error"),
        (500, None, "api_error"),
        (502, None, "api_error"),
        (503, None, "overloaded_error"),
        (529, None, "overloaded_error"),
        (504, None, "timeout_error"),
    ],
)
def test_error_types(status: int, code: str | None, kind: str) -> None:
    body = orjson.loads(M.error_body(status, "why", code))
    assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
    if kind != "request_too_large":  # documented by Anthropic, absent from the SDK's union
        ErrorResponse.model_validate(body)


def test_upstream_errors_take_anthropics_envelope_with_status_kept() -> None:
    flat = b'{"object":"error","message":"prompt too long","type":"BadRequestError","param":null,"code":400}'
    assert M.reshape_upstream_error(400, flat) == (
        400,
        orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt too long"}}),
    )
    native = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    status, body = M.reshape_upstream_error(500, native)
    assert status == 500 and orjson.loads(body)["error"] == {"type": "overloaded_error", "message": "busy"}
