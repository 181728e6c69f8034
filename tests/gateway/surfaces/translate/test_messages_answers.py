"""Anthropic Messages from chat completions: whole answers (stop reason, usage, signatures), checked
with the Anthropic SDK's own types (requests: test_messages.py)."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message
from hypothesis import given

from gateway.surfaces.translate import messages as M
from tests.translate.chat import Turn, turns
from tests.translate.messages_helpers import PROPS, TOOL, assert_same_turn, body_for, next_turn

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; cch=1f2e3;"


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


# ---- the answer's pieces ----


@pytest.mark.parametrize(
    ("finish", "matched", "calls", "expected"),
    [
        ("stop", None, False, ("end_turn", None)),
        ("stop", "###", False, ("stop_sequence", "###")),
        ("stop", "not one of ours", False, ("end_turn", None)),
        ("stop", None, True, ("tool_use", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("length", None, True, ("max_tokens", None)),
        ("content_filter", None, False, ("refusal", None)),
        ("abort", None, False, ("end_turn", None)),
        (None, None, False, (None, None)),
    ],
)
def test_stop_reason(finish: Any, matched: Any, calls: bool, expected: tuple[Any, Any]) -> None:
    assert M.stop_reason(finish, matched, ["###"], calls) == expected


def test_usage_counts_only_what_the_cache_missed_as_input() -> None:
    assert M.usage_of({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}}) == {
        "input_tokens": 2,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
        "output_tokens": 2,
    }
    assert M.usage_of(None)["input_tokens"] == 0


def test_signature_is_stable_and_depends_on_the_text() -> None:
    assert M.signature("a") == M.signature("a") != M.signature("b")
    assert M.signature("a").startswith("cg1:") and len(M.signature("a")) == 44
    assert M.signature("\ud800") != M.signature("")  # a lone surrogate from a broken model does not raise


def test_whole_answer_with_a_broken_tool_input_and_matched_stop() -> None:
    req = M.to_chat(body_for(stop_sequences=["END"]))
    completion = {
        "choices": [
            {
                "message": {
                    "content": "x",
                    "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": "{bad"}}],
                },
                "finish_reason": "stop",
            }
        ]
    }
    message = M.from_chat(completion, req, "msg_1")
    assert message["content"][1] == {"type": "tool_use", "id": "t", "name": "f", "input": {"_raw": "{bad"}}
    assert message["stop_reason"] == "tool_use"
    plain = M.from_chat({"choices": [{"message": {"content": "x"}, "matched_stop": "END"}]}, req, "msg_2")
    assert (plain["stop_reason"], plain["stop_sequence"]) == ("stop_sequence", "END")
    Message.model_validate(plain)
