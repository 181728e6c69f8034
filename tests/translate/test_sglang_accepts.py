"""Every chat body the translators send upstream is one SGLang 0.5.23's own request model accepts
(``ChatCompletionRequest`` from the installed wheel's ``protocol.py``), so a translated request
never earns a 400 from the engine for its shape."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim import sglang_ref
from gateway.surfaces.translate import messages as M
from gateway.surfaces.translate import responses as R
from tests.translate.chat import Turn, turns
from tests.translate.messages_helpers import TOOL as ANTHROPIC_TOOL
from tests.translate.messages_helpers import next_turn
from tests.translate.responses_helpers import PATCH_TOOL, TOOL, back_to_chat

ChatCompletionRequest = sglang_ref.load_protocol().ChatCompletionRequest


def accepted(chat: dict[str, Any]) -> None:
    ChatCompletionRequest.model_validate(chat)


RESPONSES_BODIES = [
    {"input": "hi", "instructions": "brief", "max_output_tokens": 10, "temperature": 0.1, "top_p": 0.9},
    {
        "input": "hi",
        "tools": [TOOL, PATCH_TOOL, {"type": "web_search"}],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "none"},
    },
    {
        "input": "hi",
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": "read_file"},
        "reasoning": {"effort": "xhigh", "summary": "auto"},
        "stream": True,
    },
    {
        "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
    },
    {
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_image", "image_url": "https://x/y.png"},
                ],
            },
            {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "b"}]},
        ]
    },
]


@pytest.mark.parametrize("body", RESPONSES_BODIES)
def test_responses_requests(body: dict[str, Any]) -> None:
    accepted(R.to_chat({"model": "kimi", **body}).chat)


MESSAGES_BODIES = [
    {"system": "s", "stop_sequences": ["x"], "top_k": 5, "temperature": 0.3, "thinking": {"type": "disabled"}},
    {
        "tools": [ANTHROPIC_TOOL],
        "tool_choice": {"type": "tool", "name": "read_file", "disable_parallel_tool_use": True},
    },
    {"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"}, "stream": True},
    {"tools": [{"type": "web_search_20250305", "name": "web_search"}], "tool_choice": {"type": "auto"}},
    {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="}},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "is_error": True,
                        "content": [
                            {"type": "text", "text": "x"},
                            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                        ],
                    },
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
                ],
            }
        ]
    },
]


@pytest.mark.parametrize("body", MESSAGES_BODIES)
def test_messages_requests(body: dict[str, Any]) -> None:
    full = {"model": "kimi", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}], **body}
    accepted(M.to_chat(full).chat)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns(), st.booleans())
def test_follow_up_turns(turn: Turn, drop_raw: bool) -> None:
    req = R.to_chat({"model": "kimi", "input": "go", "tools": [TOOL]})
    output = R.from_chat(turn.completion(), req, "resp_1", 1.0)["output"]
    accepted({"model": "kimi", "messages": back_to_chat(output, drop_raw), "tools": req.chat["tools"]})
    mreq = M.to_chat({"model": "kimi", "max_tokens": 10, "messages": [{"role": "user", "content": "go"}]})
    message = M.from_chat(turn.completion(), mreq, "msg_1")
    accepted({"model": "kimi", "messages": next_turn(message)})
