"""Anthropic Messages ⇄ chat completions: requests, answers and streams, checked with the Anthropic
SDK's own types and accumulator, and over loopback HTTP with the SDK as the client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import orjson
import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.errors import GatewayError
from gateway.translate import messages as M
from gateway.translate.common import SSEDecoder
from gateway.translate.messages_stream import MessagesStream
from tests.translate.chat import Call, SDKServer, Turn, chunks_for, sse, turns

EVENTS = pydantic.TypeAdapter(RawMessageStreamEvent)
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOL = {
    "name": "read_file",
    "description": "Read a file",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
}
BILLING = "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=cli; cch=1f2e3;"


def body_for(**fields: Any) -> dict[str, Any]:
    return {"model": "kimi", "max_tokens": 1024, "messages": [{"role": "user", "content": "hi"}], **fields}


def stream_all(req: M.MessagesRequest, chunks: list[dict[str, Any]]) -> tuple[MessagesStream, list[dict[str, Any]]]:
    s = MessagesStream(req, "msg_test", input_tokens=42)
    raw = s.start() + b"".join(s.feed(c) for c in chunks) + s.finish()
    decoder = SSEDecoder()
    events = decoder.feed(raw)
    assert decoder.skipped == 0
    names = [line[7:] for line in raw.split(b"\n") if line.startswith(b"event: ")]
    assert [e["type"].encode() for e in events] == names
    return s, events


def next_turn(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a follow-up that sends ``message`` back with one result per tool use."""
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": f"result of {b['id']}"}
        for b in message["content"]
        if b["type"] == "tool_use"
    ]
    follow = [{"role": "user", "content": "go"}, {"role": "assistant", "content": message["content"]}]
    if results:
        follow.append({"role": "user", "content": results})
    return M.to_chat(body_for(messages=follow)).chat["messages"][1:]


def assert_same_turn(messages: list[dict[str, Any]], turn: Turn) -> None:
    """The assistant turn rebuilt from Anthropic blocks says what the upstream said (arguments as
    JSON values: Anthropic carries ``input`` as an object, not the model's string)."""
    assistant = messages[0]
    assert assistant["content"] == turn.content
    assert assistant.get("reasoning_content", "") == turn.reasoning
    calls = [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in assistant.get("tool_calls", [])
    ]
    assert calls == [(c.id, c.name, json.loads(c.arguments)) for c in turn.calls]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in messages[1:]] == [
        ("tool", c.id, f"result of {c.id}") for c in turn.calls
    ]


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


def _well_formed(events: list[dict[str, Any]]) -> None:
    """message_start first, message_stop last, one block open at a time, indexes in order,
    a signature before each thinking block stops."""
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    assert events[-2]["type"] == "message_delta"
    open_block, kinds, signed = None, {}, set()
    for e in events[1:-2]:
        if e["type"] == "content_block_start":
            assert open_block is None and e["index"] == len(kinds)
            open_block, kinds[e["index"]] = e["index"], e["content_block"]["type"]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_block
            if e["delta"]["type"] == "signature_delta":
                signed.add(e["index"])
        else:
            assert e["type"] == "content_block_stop" and e["index"] == open_block
            open_block = None
    assert open_block is None
    assert signed == {i for i, k in kinds.items() if k == "thinking"}


@PROPS
@given(st.data())
def test_streamed_answer_round_trips_through_the_sdk_accumulator(data: st.DataObject) -> None:
    turn = data.draw(turns())
    req = M.to_chat(body_for(tools=[TOOL], stream=True))
    stream, events = stream_all(req, chunks_for(data.draw, turn))
    _well_formed(events)
    snapshot, bufs = None, {}
    for raw in events:
        snapshot = accumulate_event(event=EVENTS.validate_python(raw), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    final = Message.model_validate(snapshot.to_dict())
    assert final.model_dump() == Message.model_validate(stream.message).model_dump()
    # Every argument fragment arrives, in order, on its own block: the string reassembles exactly.
    tool_blocks = [i for i, b in enumerate(final.content) if b.type == "tool_use"]
    assert [bufs.get(i, b"").decode() for i in tool_blocks] == [c.arguments for c in turn.calls]
    assert [(final.content[i].id, final.content[i].input) for i in tool_blocks] == [  # type: ignore[union-attr]
        (c.id, json.loads(c.arguments)) for c in turn.calls
    ]
    assert_same_turn(next_turn(stream.message), turn)
    assert final.usage.cache_read_input_tokens == turn.usage["prompt_tokens_details"]["cached_tokens"]


def test_message_start_before_upstream_then_ping_and_stop_sequence() -> None:
    req = M.to_chat(body_for(stop_sequences=["###"], stream=True))
    stream = MessagesStream(req, "msg_1", input_tokens=77)
    first = SSEDecoder().feed(stream.start() + stream.ping())
    assert [e["type"] for e in first] == ["message_start", "ping"]
    assert first[0]["message"]["usage"]["input_tokens"] == 77
    raw = (
        stream.feed(
            {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop", "matched_stop": "###"}]}
        )
        + stream.finish()
    )
    events = SSEDecoder().feed(raw)
    assert "message_start" not in [e["type"] for e in events]
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}
    assert first[1] == {"type": "ping"}  # not in the SDK's event union: its stream skips pings
    for e in [first[0], *events]:
        EVENTS.validate_python(e)


def test_broken_stream_ends_with_an_error_event() -> None:
    stream = MessagesStream(M.to_chat(body_for()), "msg_1")
    raw = stream.start() + stream.feed({"choices": [{"index": 0, "delta": {"content": "par"}}]})
    raw += stream.feed({"error": {"message": "engine died", "code": 503}})
    last = SSEDecoder().feed(raw)[-1]
    assert last == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}
    assert stream.finish() == b""
    other = MessagesStream(M.to_chat(body_for()), "msg_2")
    assert orjson.loads(other.fail("queue timed out", 503, "queue_timeout").split(b"data: ")[1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "queue timed out"},
    }


def test_late_fragment_of_an_earlier_call_is_not_lost() -> None:
    def call(i: int, args: str, name: str | None = None) -> dict[str, Any]:
        fn = {"arguments": args} | ({"name": name} if name else {})
        return {
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": f"functions.f:{i}", "function": fn}]}}]
        }

    chunks = [
        call(0, '{"a"', "f"),
        call(1, '{"b": 2}', "g"),
        call(0, ": 1}"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    _stream, events = stream_all(M.to_chat(body_for()), chunks)
    snapshot, bufs = None, {}
    for raw in events:
        snapshot = accumulate_event(event=EVENTS.validate_python(raw), current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    assert [(b.id, b.input) for b in snapshot.content] == [("functions.f:0", {"a": 1}), ("functions.f:1", {"b": 2})]


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


# ---- the official SDK over loopback HTTP ----


@pytest.fixture()
def server() -> Iterator[SDKServer]:
    srv = SDKServer()
    srv.start()
    yield srv
    srv.stop()


TOOL_TURN = Turn(
    reasoning="Need the file.",
    content="Reading it.",
    calls=[Call("functions.read_file:0", "read_file", '{"path": "README.md"}')],
    finish="tool_calls",
    usage={"prompt_tokens": 120, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 100}},
)


def test_anthropic_sdk_create_stream_and_count(server: SDKServer) -> None:
    async def handler(request: Request) -> Any:
        body = M.load_body(await request.body())
        if request.url.path.endswith("/count_tokens"):
            return JSONResponse(M.count_tokens(body, 0.25))
        req = M.to_chat(body)
        if not req.stream:
            return JSONResponse(M.from_chat(TOOL_TURN.completion(), req, "msg_sdk"))
        stream = MessagesStream(req, "msg_sdk", input_tokens=5)
        chunks = chunks_for(lambda _strategy: [], TOOL_TURN)  # type: ignore[arg-type,return-value]
        return sse(iter([stream.start(), stream.ping(), *(stream.feed(c) for c in chunks), stream.finish()]))

    server.handler = handler
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    messages: Any = [{"role": "user", "content": "read the readme"}]
    created = client.messages.create(model="kimi", max_tokens=100, messages=messages, tools=[TOOL])  # type: ignore[list-item]
    assert [b.type for b in created.content] == ["thinking", "text", "tool_use"]
    assert created.content[2].id == "functions.read_file:0" and created.stop_reason == "tool_use"  # type: ignore[union-attr]
    assert created.usage.cache_read_input_tokens == 100 and created.usage.input_tokens == 20

    with client.messages.stream(model="kimi", max_tokens=100, messages=messages, tools=[TOOL]) as stream:  # type: ignore[list-item]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Reading it."
    tool = final.content[2]
    assert (tool.type, tool.id, tool.input) == ("tool_use", "functions.read_file:0", {"path": "README.md"})  # type: ignore[union-attr]
    assert final.usage.cache_read_input_tokens == 100 and final.stop_reason == "tool_use"

    counted = client.messages.count_tokens(model="kimi", messages=messages)
    assert counted.input_tokens > 0
    assert server.requests[-1]["path"] == "/v1/messages/count_tokens"


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
