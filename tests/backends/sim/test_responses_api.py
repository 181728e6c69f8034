"""backends/sim/responses_api.py: SGLang's Responses API as data: the bounded store behind
``previous_response_id``, input items turned into chat messages, function tools, the response object,
its items and usage, and the SSE writer. The route over HTTP: test_routes_responses.py."""

from __future__ import annotations

import base64
import zlib
from typing import Any

import orjson
import pytest

from backends.sim import responses_api as X


def _resp(rid: str) -> dict[str, Any]:
    return {"id": rid, "output": []}


def test_the_store_keeps_the_newest_responses_and_their_history() -> None:
    store = X.Store(limit=2)
    for i in range(3):
        store.put(_resp(f"resp_{i}"), [{"role": "user", "content": str(i)}])
    assert list(store.responses) == ["resp_1", "resp_2"] and set(store.history) == {"resp_1", "resp_2"}
    assert store.get("resp_2")["id"] == "resp_2"
    with pytest.raises(X.ResponsesError, match="not found") as missing:
        store.get("resp_0")
    assert (missing.value.status, missing.value.param) == (404, "response_id")
    with pytest.raises(X.ResponsesError, match="begins with 'resp'") as bad:
        store.get("msg_1")
    assert bad.value.status == 400


def test_error_body_types_follow_the_status() -> None:
    assert X.error_body(X.ResponsesError("gone", 404, "response_id")) == {
        "object": "error",
        "message": "gone",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    assert X.error_body(X.ResponsesError("boom", 500))["type"] == "BadRequestError"


def test_input_history_appends_this_input_to_the_previous_responses_items() -> None:
    store = X.Store()
    earlier = [{"role": "user", "content": "a"}, {"type": "message", "role": "assistant", "content": "b"}]
    store.put(_resp("resp_prev"), earlier)
    got = X.input_history({"previous_response_id": "resp_prev", "input": "c"}, store)
    assert got == [*earlier, {"role": "user", "content": "c"}]
    assert store.history["resp_prev"] == earlier  # a copy: the stored history is unchanged
    items = [{"type": "function_call_output", "call_id": "call_1", "output": "ok"}]
    assert X.input_history({"input": items}, store) == items
    assert X.input_history({}, store) == []
    with pytest.raises(X.ResponsesError, match="valid string or list"):
        X.input_history({"input": 5}, store)
    with pytest.raises(X.ResponsesError, match="not found"):
        X.input_history({"previous_response_id": "resp_gone", "input": "c"}, store)


def test_items_become_chat_messages_an_answer_and_its_calls_one_assistant_turn() -> None:
    history = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "read "}, {"type": "input_text", "text": "it"}]},
        {"type": "reasoning", "id": "rs_1", "content": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
        {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": '{"p": 1}'},
        {"type": "function_call", "id": "fc_2", "name": "list"},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "data"}]},
        {"type": "item_reference", "id": "x"},
    ]
    messages = X.to_messages("You are terse.", history)
    assert messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}},
                {"id": "fc_2", "type": "function", "function": {"name": "list", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "data"},
    ]


@pytest.mark.parametrize("item", ["just text", {"role": "tool", "content": "x"}])
def test_an_item_that_is_no_message_is_refused(item: Any) -> None:
    with pytest.raises(X.ResponsesError) as err:
        X.to_messages(None, [item])
    assert err.value.param == "input"


def test_only_named_function_tools_become_chat_tools() -> None:
    tools = [
        {"type": "function", "name": "read", "parameters": {"type": "object"}},
        {"type": "function", "name": "bare"},
        {"type": "web_search"},
        {"type": "function"},
        "junk",
    ]
    assert X.chat_tools(tools) == [
        {"type": "function", "function": {"name": "read", "description": "", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "bare", "description": "", "parameters": {}}},
    ]
    assert X.chat_tools(None) == []


def test_usage_shape() -> None:
    assert X.usage(100, 20, 64, 5) == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 120,
    }


def test_the_response_object_echoes_the_request_and_reports_an_incomplete_answer() -> None:
    body = {
        "instructions": "hi",
        "max_output_tokens": 9,
        "reasoning": {"effort": "high"},
        "store": False,
        "parallel_tool_calls": False,
        "metadata": {"k": "v"},
    }
    message = X.message_item("msg_1", "text", "completed")
    r = X.response(body, "resp_1", 5, "m", [message], "incomplete", None)
    assert r["incomplete_details"] == {"reason": "max_output_tokens"} and r["reasoning"]["effort"] == "high"
    assert (r["instructions"], r["max_output_tokens"], r["store"], r["parallel_tool_calls"]) == ("hi", 9, False, False)
    assert r["text"] == {"format": {"type": "text"}} and r["metadata"] == {"k": "v"}
    call = X.function_call_item("fc_1", "call_1", "read", "{}", "completed")
    plain = X.response({"reasoning": {"effort": "none"}}, "resp_2", 5, "m", [call], "completed", None)
    assert plain["incomplete_details"] is None and plain["reasoning"]["effort"] is None and plain["text"] is None
    assert plain["store"] is True and plain["truncation"] == "disabled" and plain["tool_choice"] == "auto"


def test_a_reasoning_item_in_progress_and_done_with_summary_and_encrypted_content() -> None:
    assert X.reasoning_item("rs_1", "why", "in_progress", True, True) == {
        "id": "rs_1",
        "summary": [],
        "type": "reasoning",
        "content": [],
        "encrypted_content": None,
        "status": "in_progress",
    }
    done = X.reasoning_item("rs_1", "why", "completed", True, True)
    assert done["summary"] == [{"text": "why", "type": "summary_text"}]
    assert done["content"] == [{"text": "why", "type": "reasoning_text"}]
    blob = done["encrypted_content"].removeprefix(X.REASONING_STATE_PREFIX)
    assert zlib.decompress(base64.urlsafe_b64decode(blob)) == b"why"
    assert X.reasoning_item("rs_1", "why", "completed", False)["summary"] == []
    assert X.wants_encrypted_reasoning({"include": ["reasoning.encrypted_content"]})
    assert not X.wants_encrypted_reasoning({"include": "reasoning.encrypted_content"})


def test_message_items_carry_their_text_once_completed() -> None:
    assert X.message_item("msg_1", "", "in_progress")["content"] == []
    assert X.message_item("msg_1", "hi", "completed")["content"] == [X.output_text("hi")]


def test_the_event_writer_numbers_its_events() -> None:
    send = X.EventWriter()
    first = send("response.created", response={"id": "resp_1"})
    second = send("response.completed", response={"id": "resp_1"})
    head, data = first.split(b"\n", 1)
    assert head == b"event: response.created" and first.endswith(b"\n\n")
    assert orjson.loads(data.removeprefix(b"data: ")) == {
        "type": "response.created",
        "sequence_number": 0,
        "response": {"id": "resp_1"},
    }
    assert orjson.loads(second.split(b"\n")[1][6:])["sequence_number"] == 1


def test_new_ids_have_sglangs_prefixes_and_lengths() -> None:
    rid, call = X.new_id("resp"), X.new_id("call", 24)
    assert rid.startswith("resp_") and len(rid) == 5 + 32 and len(call) == 5 + 24
    assert X.new_id("resp") != rid
