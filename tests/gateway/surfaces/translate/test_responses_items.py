"""The pieces of a Response (gateway/surfaces/translate/responses_items.py): output items, usage, the end
state and the Response object with its echoed fields, and a whole chat completion turned into one,
checked with the OpenAI SDK's own types."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from openai.types.responses import Response

from gateway.surfaces.translate import responses_items as items
from tests.translate.chat import Turn, turns
from tests.translate.responses_helpers import PATCH_TOOL, PROPS, TOOL, assert_same_turn, back_to_chat, req_for


@PROPS
@given(turns())
def test_non_streamed_answer_round_trips(turn: Turn) -> None:
    req = req_for(tools=[TOOL])
    response = items.from_chat(turn.completion(), req, "resp_x", 1.0)
    parsed = Response.model_validate(response)
    assert parsed.status == ("incomplete" if turn.finish == "length" else "completed")
    if turn.finish == "length":
        assert parsed.incomplete_details is not None and parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.output_text == turn.content
    usage = turn.usage
    assert parsed.usage is not None and parsed.usage.input_tokens == usage["prompt_tokens"]
    assert parsed.usage.input_tokens_details.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]
    assert parsed.usage.total_tokens == usage["prompt_tokens"] + usage["completion_tokens"]
    messages = back_to_chat(response["output"])
    assert_same_turn(messages[0], turn)
    assert [(m["tool_call_id"], m["content"]) for m in messages[1:]] == [
        (c.id, f"result of {c.id}") for c in turn.calls
    ]


def test_packed_reasoning_is_our_prefix_and_urlsafe_base64_of_the_text() -> None:
    text = "think ✓ + / = ?"
    packed = items.pack_reasoning(text)
    assert packed.startswith("cg1:") and "+" not in packed[4:] and "/" not in packed[4:]
    assert base64.urlsafe_b64decode(packed[4:]).decode() == text
    assert items.pack_reasoning("") == "cg1:"


def test_response_usage() -> None:
    usage = items.response_usage(
        {
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "prompt_tokens_details": {"cached_tokens": 150},  # more than the prompt: capped
            "completion_tokens_details": {"reasoning_tokens": 12},
        }
    )
    assert usage == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 12},
        "total_tokens": 120,
    }
    assert items.response_usage(None) is None and items.response_usage([1]) is None
    assert items.response_usage({})["total_tokens"] == 0  # type: ignore[index]


@pytest.mark.parametrize(
    ("finish", "reason"),
    [("length", "max_output_tokens"), ("content_filter", "content_filter"), ("stop", None), (None, None)],
)
def test_incomplete_reason(finish: str | None, reason: str | None) -> None:
    assert items.incomplete_reason(finish) == reason


def test_reasoning_item_mirrors_the_trace_into_the_summary_only_when_asked() -> None:
    asked = items.reasoning_item("rs_1", "trace", True, "completed")
    assert asked["summary"] == [{"type": "summary_text", "text": "trace"}]
    assert asked["content"] == [{"type": "reasoning_text", "text": "trace"}]
    assert asked["encrypted_content"] == items.pack_reasoning("trace")
    assert items.reasoning_item("rs_1", "trace", False, "completed")["summary"] == []


def test_response_object_echoes_the_request_and_fills_the_apis_defaults() -> None:
    plain = items.response_object(req_for(), "resp_1", 5.0, "in_progress", [])
    Response.model_validate(plain)
    assert (plain["id"], plain["status"], plain["model"], plain["created_at"]) == ("resp_1", "in_progress", "kimi", 5.0)
    assert (plain["tool_choice"], plain["truncation"], plain["text"]) == (
        "auto",
        "disabled",
        {"format": {"type": "text"}},
    )
    assert (plain["parallel_tool_calls"], plain["store"], plain["metadata"], plain["tools"]) == (True, True, {}, [])
    assert plain["incomplete_details"] is None and plain["error"] is None and plain["usage"] is None
    req = req_for(
        instructions="be brief",
        tools=[TOOL, {"type": "web_search"}],
        tool_choice="required",
        parallel_tool_calls=False,
        store=False,
        previous_response_id="resp_0",
        metadata={"k": "v"},
    )
    echoed = items.response_object(req, "resp_2", 6.0, "incomplete", [], incomplete_reason="max_output_tokens")
    Response.model_validate(echoed)
    assert (echoed["instructions"], echoed["tool_choice"], echoed["parallel_tool_calls"]) == (
        "be brief",
        "required",
        False,
    )
    assert (echoed["store"], echoed["previous_response_id"], echoed["metadata"]) == (False, "resp_0", {"k": "v"})
    assert echoed["tools"] == [TOOL] and echoed["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_answer_is_one_empty_message() -> None:
    response = items.from_chat(
        {"choices": [{"message": {"content": None}, "finish_reason": "stop"}]}, req_for(), "r", 1
    )
    (message,) = response["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == ""
    assert response["status"] == "completed" and response["usage"] is None
    assert items.from_chat({}, req_for(), "r", 1)["output"][0]["type"] == "message"  # no choices at all


def test_whole_answer_items_in_order_with_ids_and_a_custom_tool_call() -> None:
    completion = {
        "choices": [
            {
                "message": {
                    "reasoning": "hm",  # the other name engines give the trace
                    "content": "Patching.",
                    "tool_calls": [
                        {"function": {"name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'}},
                        {"id": "functions.read_file:1", "function": {"name": "read_file", "arguments": "{}"}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    response = items.from_chat(completion, req_for(tools=[PATCH_TOOL, TOOL]), "resp_1", 1.0)
    Response.model_validate(response)
    kinds = [(o["type"], o["id"][: o["id"].index("_") + 1]) for o in response["output"]]
    assert kinds == [("reasoning", "rs_"), ("message", "msg_"), ("custom_tool_call", "ctc_"), ("function_call", "fc_")]
    custom, function = response["output"][2:]
    assert custom["input"] == "*** Begin Patch" and custom["call_id"].startswith("call_")  # no id upstream: one made
    assert (function["call_id"], function["arguments"], function["status"]) == (
        "functions.read_file:1",
        "{}",
        "completed",
    )
    assert len({o["id"] for o in response["output"]}) == 4
