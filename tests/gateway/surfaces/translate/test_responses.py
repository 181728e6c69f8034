"""Responses API ⇄ chat completions (gateway/surfaces/translate/responses.py): the request, the items folded
into chat messages, and the upstream error envelope (the whole answer's items: test_responses_items.py;
tools: test_responses_tools.py; streams: test_responses_stream.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.http.errors import GatewayError
from gateway.surfaces.translate import responses as R
from tests.translate.responses_helpers import PATCH_TOOL, TOOL, req_for

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


# ---- errors ----


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


# ---- request fields ----


@pytest.mark.parametrize("name", ["background", "conversation", "prompt"])
def test_features_the_gateway_cannot_serve_are_named(name: str) -> None:
    with pytest.raises(GatewayError) as err:
        R.to_chat({"model": "kimi", "input": "x", name: {"id": "c"} if name != "background" else True})
    assert (err.value.status, err.value.code, err.value.param) == (400, "unsupported_parameter", name)
    assert R.to_chat({"model": "kimi", "input": "x", name: None}).chat["messages"]  # absent or null is fine


@pytest.mark.parametrize(
    ("reasoning", "effort", "template", "summary"),
    [
        ({"effort": "minimal"}, "low", None, False),
        ({"effort": "medium"}, "medium", None, False),
        ({"effort": "xhigh", "summary": "detailed"}, "high", None, True),
        ({"effort": "none"}, None, {"thinking": False}, False),
        ({"effort": "extreme"}, None, None, False),
        ({"summary": "auto"}, None, None, True),
        ("high", None, None, False),  # not an object: ignored
    ],
)
def test_reasoning_effort_and_summary(reasoning: Any, effort: str | None, template: Any, summary: bool) -> None:
    req = req_for(reasoning=reasoning)
    assert req.chat.get("reasoning_effort") == effort
    assert req.chat.get("chat_template_kwargs") == template
    assert req.wants_summary is summary


def test_structured_output_formats() -> None:
    schema = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True, "extra": 1}
    assert req_for(text={"format": schema}).chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
    }
    assert req_for(text={"format": {"type": "json_object"}}).chat["response_format"] == {"type": "json_object"}
    assert "response_format" not in req_for(text={"format": {"type": "text"}}).chat
    assert "response_format" not in req_for(text="json").chat


def test_defaults_hints_and_echoed_fields() -> None:
    plain = req_for()
    assert (plain.stream, plain.store, plain.previous_response_id, plain.session_hint) == (False, True, None, None)
    assert "stream_options" not in plain.chat and "tools" not in plain.chat
    assert req_for(stream=None, store=None).store is True
    assert req_for(user="u-1").session_hint == "u-1"
    assert req_for(user="u-1", prompt_cache_key="conv").session_hint == "conv"
    assert req_for(prompt_cache_key=7).session_hint is None
    req = req_for(metadata={"k": "v"}, truncation="auto", top_p=0.9, include=["x"], max_output_tokens=9)
    assert req.echo == {"metadata": {"k": "v"}, "truncation": "auto", "top_p": 0.9, "max_output_tokens": 9}
    assert (req.chat["top_p"], req.chat["max_tokens"]) == (0.9, 9)


def test_a_tool_choice_without_tools_the_backend_can_run_is_dropped() -> None:
    req = req_for(tools=[{"type": "web_search"}], tool_choice="required")
    assert "tools" not in req.chat and "tool_choice" not in req.chat and req.tools == []
    assert "tool_choice" not in req_for(tools=[TOOL]).chat  # none given: the engine's default


def test_previous_response_id_is_read_and_checked() -> None:
    assert R.previous_response_id({}) is None and R.previous_response_id({"previous_response_id": None}) is None
    assert R.previous_response_id({"previous_response_id": "resp_1"}) == "resp_1"
    with pytest.raises(GatewayError) as err:
        R.previous_response_id({"previous_response_id": ""})
    assert err.value.param == "previous_response_id"


def test_reasoning_text_prefers_raw_content_then_our_packed_trace_then_the_summary() -> None:
    summary = [{"type": "summary_text", "text": "short"}]
    packed = R.pack_reasoning("the whole trace ✓")
    assert R.reasoning_text({"content": [{"type": "reasoning_text", "text": "raw"}], "summary": summary}) == "raw"
    assert R.reasoning_text({"encrypted_content": packed, "summary": summary}) == "the whole trace ✓"
    assert R.reasoning_text({"encrypted_content": "gAAAA-opaque-from-openai", "summary": summary}) == "short"
    assert R.reasoning_text({"encrypted_content": "cg1:%%%not base64", "summary": summary}) == "short"
    assert R.reasoning_text({"summary": [*summary, {"type": "summary_text", "text": "more"}]}) == "short\n\nmore"
    assert R.reasoning_text({"type": "reasoning"}) == ""


def test_folding_starts_a_new_assistant_turn_where_the_conversation_says_so() -> None:
    messages = R.items_to_messages(
        [
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "a"}]},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "b"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "message", "role": "assistant", "content": "after the call"},
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"type": "function_call_output", "call_id": "c1", "output": None},
        ]
    )
    assert messages == [
        {
            "role": "assistant",
            "reasoning_content": "a\n\nb",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            "content": "",
        },
        {"role": "assistant", "content": "after the call"},
        {"role": "assistant", "content": "no"},
        {"role": "tool", "tool_call_id": "c1", "content": ""},
    ]


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"type": "message", "role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}, "input[0].arguments"),
        ({"type": "custom_tool_call", "call_id": "c", "name": "f", "input": 3}, "input[0]"),
        ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
        ({"type": "message", "role": "user", "content": 5}, "input[0].content"),
        ({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_file"}]}, "input[0].output[0]"),
        ({"content": "no role, no type"}, "input[0]"),
    ],
)
def test_bad_items_are_400_with_where(item: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        R.items_to_messages([item])
    assert err.value.status == 400 and err.value.param == param


def test_an_image_detail_outside_the_apis_values_is_dropped() -> None:
    (message,) = R.items_to_messages(
        [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png", "detail": "max"}]}]
    )
    assert message["content"] == [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
