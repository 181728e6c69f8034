"""backends/sim/responses.py: SGLang 0.5.23's chat and completion JSON bodies, built directly and
checked field by field and against SGLang's own pydantic models (a validate-then-dump round trip
gives the same JSON). The bodies over HTTP: tests/backends/test_twin_fidelity.py."""

from __future__ import annotations

import json
from typing import Any

import orjson

from backends.sim import responses as R
from backends.sim import sglang_ref

P = sglang_ref.load_protocol()
CALL = {"id": "functions.read:0", "type": "function", "function": {"name": "read", "arguments": '{"path": "a"}'}}


def roundtrip(model: Any, data: dict[str, Any], **dump: Any) -> None:
    assert json.loads(model.model_validate(data).model_dump_json(by_alias=True, **dump)) == data


def test_usage_reports_cached_and_reasoning_tokens_only_when_there_are_some_to_report() -> None:
    u = R.usage(100, 20, 64, cache_report=True, reasoning=5)
    assert u == {
        "prompt_tokens": 100,
        "total_tokens": 120,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 64},
        "reasoning_tokens": 5,
        "completion_tokens_details": {"reasoning_tokens": 5},
    }
    plain = R.usage(100, 20, 64, cache_report=False)
    assert plain["prompt_tokens_details"] is None and plain["completion_tokens_details"] is None
    assert plain["reasoning_tokens"] == 0
    roundtrip(P.UsageInfo, u)


def test_sse_frames_one_event_and_done_ends_the_stream() -> None:
    assert R.sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert R.DONE == b"data: [DONE]\n\n"


def test_error_body_is_the_flat_error_response() -> None:
    body = R.error_body("bad", "BadRequestError", 400)
    assert body == {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    roundtrip(P.ErrorResponse, body)


def test_chat_response_carries_tool_calls_with_their_index() -> None:
    usage = R.usage(10, 3, 0, cache_report=True)
    body = R.chat_response(
        "rid",
        1,
        "m",
        content="",
        reasoning="think",
        tool_calls=[CALL, {**CALL, "id": "functions.read:1"}],
        finish_reason="tool_calls",
        matched_stop=None,
        usage_=usage,
    )
    message = body["choices"][0]["message"]
    assert [c["index"] for c in message["tool_calls"]] == [0, 1]
    assert message["tool_calls"][1] == {
        "id": "functions.read:1",
        "index": 1,
        "type": "function",
        "function": {"name": "read", "arguments": '{"path": "a"}'},
    }
    assert message["reasoning_content"] == "think" and body["choices"][0]["finish_reason"] == "tool_calls"
    roundtrip(P.ChatCompletionResponse, body)
    plain = R.chat_response(
        "rid",
        1,
        "m",
        content="hi",
        reasoning=None,
        tool_calls=None,
        finish_reason="stop",
        matched_stop=R.KIMI_EOS_TOKEN_ID,
        usage_=usage,
    )
    assert "tool_calls" not in plain["choices"][0]["message"] and plain["choices"][0]["matched_stop"] == 163586


def test_chat_chunk_omits_unset_delta_fields_but_always_has_reasoning_content() -> None:
    first = R.chat_chunk("rid", 1, "m", role="assistant", content="")
    assert first["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    assert "usage" not in first
    piece = R.chat_chunk("rid", 1, "m", reasoning="hmm", usage_={"prompt_tokens": 1})
    assert piece["choices"][0]["delta"] == {"reasoning_content": "hmm"} and piece["usage"] == {"prompt_tokens": 1}
    last = R.chat_chunk("rid", 1, "m", finish_reason="stop", matched_stop=R.KIMI_EOS_TOKEN_ID)
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["matched_stop"] == 163586
    for chunk in (first, last):
        P.ChatCompletionStreamResponse.model_validate(chunk)


def test_the_tool_call_chunk_and_the_usage_chunk_are_sglangs_stream_responses() -> None:
    calls = R.chat_tool_call_chunk("rid", 1, "m", [CALL])
    delta = calls["choices"][0]["delta"]
    assert delta["tool_calls"][0]["index"] == 0 and delta["role"] is None and calls["usage"] is None
    roundtrip(P.ChatCompletionStreamResponse, calls)
    usage = R.chat_usage_chunk("rid", 1, "m", R.usage(3, 2, 1, cache_report=True))
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 5
    roundtrip(P.ChatCompletionStreamResponse, usage)


def test_completion_bodies() -> None:
    usage = R.usage(7, 2, 0, cache_report=False)
    whole = R.completion_response(
        "rid", 1, "m", text="abcdefgh", finish_reason="length", matched_stop=None, usage_=usage
    )
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "abcdefgh"
    roundtrip(P.CompletionResponse, whole)
    chunk = R.completion_chunk("rid", 1, "m", text="ab", finish_reason=None, matched_stop=None)
    assert chunk["usage"] is None and chunk["choices"][0]["text"] == "ab"
    roundtrip(P.CompletionStreamResponse, chunk)


def test_the_completion_usage_chunk_drops_null_fields_as_sglang_dumps_it() -> None:
    chunk = R.completion_usage_chunk("rid", 1, "m", R.usage(7, 2, 0, cache_report=False))
    assert chunk["choices"] == [] and chunk["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 9,
        "completion_tokens": 2,
        "reasoning_tokens": 0,
    }
    dumped = P.CompletionStreamResponse.model_validate(chunk).model_dump_json(exclude_none=True)
    assert orjson.loads(dumped)["usage"] == chunk["usage"]
