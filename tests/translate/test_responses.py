"""Responses API ⇄ chat completions: requests and whole answers, checked with the OpenAI SDK's own types
(streams: test_responses_stream.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from openai.types.responses import Response

from gateway.http.errors import GatewayError
from gateway.surfaces.translate import responses as R
from tests.translate.chat import Turn, turns
from tests.translate.responses_helpers import PATCH_TOOL, PROPS, TOOL, assert_same_turn, back_to_chat, req_for

# ---- requests ----


def test_string_input_and_instructions() -> None:
    req = R.to_chat(
        {
            "model": "kimi",
            "input": "hello",
            "instructions": "Be brief.",
            "max_output_tokens": 64,
            "temperature": 0.2,
            "stream": True,
            "store": False,
            "prompt_cache_key": "conv-1",
        }
    )
    assert req.chat == {
        "model": "kimi",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 64,
        "temperature": 0.2,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
    }
    assert (req.stream, req.store, req.session_hint) == (True, False, "conv-1")
    assert req.input_items == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}
    ]


def test_items_fold_into_chat_messages() -> None:
    items = [
        {"type": "message", "role": "developer", "content": "rules"},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
            ],
        },
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I'll read."}]},
        {"type": "function_call", "call_id": "functions.read_file:0", "name": "read_file", "arguments": '{"p": 1}'},
        {"type": "function_call", "call_id": "functions.read_file:1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "functions.read_file:0", "output": "A"},
        {
            "type": "function_call_output",
            "call_id": "functions.read_file:1",
            "output": [{"type": "input_text", "text": "B"}],
        },
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "done"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Both read."}]},
    ]
    req = R.to_chat(
        {
            "model": "kimi",
            "input": items,
            "tools": [TOOL, {"type": "web_search"}],
            "tool_choice": {"type": "function", "name": "read_file"},
            "parallel_tool_calls": False,
        }
    )
    assert req.chat["messages"] == [
        {"role": "system", "content": "rules"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "reasoning_content": "hm",
            "content": "I'll read.",
            "tool_calls": [
                {
                    "id": "functions.read_file:0",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"p": 1}'},
                },
                {
                    "id": "functions.read_file:1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "A"},
        {"role": "tool", "tool_call_id": "functions.read_file:1", "content": "B"},
        {"role": "assistant", "reasoning_content": "done", "content": "Both read."},
    ]
    assert req.chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "read_file", "description": "Read a file", "parameters": TOOL["parameters"]},
        }
    ]
    assert req.chat["tool_choice"] == {"type": "function", "function": {"name": "read_file"}}
    assert req.chat["parallel_tool_calls"] is False
    assert req.tools == [TOOL]  # echoed in the Response in the flat shape


def test_previous_items_come_first_and_instructions_do_not_carry_over() -> None:
    prior = [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "one"}]},
    ]
    req = R.to_chat(
        {"model": "kimi", "input": "second", "instructions": "new", "previous_response_id": "resp_1"}, prior
    )
    assert [m["content"] for m in req.chat["messages"]] == ["new", "first", "one", "second"]
    assert req.input_items[:2] == prior and req.previous_response_id == "resp_1"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 5}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
        (
            {"input": [{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
        ({"background": True}, "background"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"model": ""}, "model"),
        ({"input": []}, "input"),
        ({"previous_response_id": 7}, "previous_response_id"),
        ({"temperature": "hot"}, "temperature"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)
def test_bad_requests_are_400_with_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        R.to_chat({"model": "kimi", "input": "x", **body})
    assert err.value.status == 400 and err.value.param == param


def test_load_body_rejects_non_objects() -> None:
    for raw in (b"", b"[1]", b"{nope"):
        with pytest.raises(GatewayError):
            R.load_body(raw)
    assert R.load_body(b'{"model":"m"}') == {"model": "m"}


# ---- answers ----


@PROPS
@given(turns())
def test_non_streamed_answer_round_trips(turn: Turn) -> None:
    req = req_for(tools=[TOOL])
    response = R.from_chat(turn.completion(), req, "resp_x", 1.0)
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


def test_upstream_errors_take_openais_envelope_with_status_kept() -> None:
    flat = b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}'
    status, body = R.reshape_upstream_error(400, flat)
    assert status == 400
    assert orjson.loads(body) == {
        "error": {"message": "too long", "type": "invalid_request_error", "param": None, "code": None}
    }
    nested = {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    }
    assert orjson.loads(R.reshape_upstream_error(404, nested)[1])["error"]["code"] == "model_not_found"
    status, body = R.reshape_upstream_error(503, b"Service Unavailable")
    assert status == 503 and orjson.loads(body)["error"]["message"] == "Service Unavailable"


# ---- custom (freeform) tools, as Codex's apply_patch ----


def test_custom_tools_become_one_string_functions() -> None:
    req = req_for(tools=[PATCH_TOOL, TOOL], tool_choice={"type": "custom", "name": "apply_patch"})
    fn = req.chat["tools"][0]["function"]
    assert fn["name"] == "apply_patch" and fn["parameters"]["required"] == ["input"]
    assert 'start: "*** Begin Patch" body' in fn["parameters"]["properties"]["input"]["description"]
    assert req.chat["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    assert req.tools[0] == PATCH_TOOL and req.custom_tools == frozenset({"apply_patch"})
    history = R.to_chat(
        {
            "model": "kimi",
            "tools": [PATCH_TOOL],
            "input": [
                {
                    "type": "custom_tool_call",
                    "call_id": "functions.apply_patch:0",
                    "name": "apply_patch",
                    "input": "*** Begin Patch\n+é\n",
                },
                {"type": "custom_tool_call_output", "call_id": "functions.apply_patch:0", "output": "Done"},
            ],
        }
    ).chat["messages"]
    call = history[0]["tool_calls"][0]
    assert call["id"] == "functions.apply_patch:0"
    assert orjson.loads(call["function"]["arguments"]) == {"input": "*** Begin Patch\n+é\n"}
    assert history[1] == {"role": "tool", "tool_call_id": "functions.apply_patch:0", "content": "Done"}
