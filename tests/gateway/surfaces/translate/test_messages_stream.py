"""Anthropic Messages ⇄ chat completions: streams, checked with the Anthropic SDK's own types and
accumulator, and over loopback HTTP with the SDK as the client."""

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
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.surfaces.translate import messages as M
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translate.messages_stream import MessagesStream
from tests.translate.chat import Call, SDKServer, Turn, chunks_for, sse, turns
from tests.translate.messages_helpers import PROPS, TOOL, assert_same_turn, body_for, next_turn

EVENTS = pydantic.TypeAdapter(RawMessageStreamEvent)


def stream_all(req: M.MessagesRequest, chunks: list[dict[str, Any]]) -> tuple[MessagesStream, list[dict[str, Any]]]:
    s = MessagesStream(req, "msg_test", input_tokens=42)
    raw = s.start() + b"".join(s.feed(c) for c in chunks) + s.finish()
    decoder = SSEDecoder()
    events = decoder.feed(raw)
    assert decoder.skipped == 0
    names = [line[7:] for line in raw.split(b"\n") if line.startswith(b"event: ")]
    assert [e["type"].encode() for e in events] == names
    return s, events


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


# ---- edges ----


def test_finish_alone_is_a_whole_empty_message_and_everything_after_is_nothing() -> None:
    stream = MessagesStream(M.to_chat(body_for()), "msg_1", input_tokens=9)
    events = SSEDecoder().feed(stream.finish())
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]
    assert events[1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[1]["usage"] == {"input_tokens": 9, "output_tokens": 0}
    assert stream.start() == b"" and stream.finish() == b"" and stream.fail("late") == b""
    assert stream.feed({"choices": [{"index": 0, "delta": {"content": "late"}}]}) == b""
    assert stream.message["content"] == []


def test_what_is_not_a_chunk_is_ignored() -> None:
    stream = MessagesStream(M.to_chat(body_for()), "msg_1")
    assert stream.feed([1, 2]) == b"" and stream.feed("text") == b""
    assert stream.start() != b""  # still not started: nothing was sent
    assert stream.feed({"id": "x"}) == b""  # a chunk of nothing, after message_start


def test_arguments_before_the_calls_name_wait_for_it_and_a_nameless_call_still_delivers() -> None:
    def part(i: int, fn: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
        call = {"index": i, "function": fn} | ({"id": call_id} if call_id else {})
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    stream = MessagesStream(M.to_chat(body_for()), "msg_1")
    raw = stream.start()
    assert stream.feed(part(0, {"arguments": '{"p": '}, "functions.f:0")) == b""  # no name yet: held
    raw += stream.feed(part(0, {"name": "f", "arguments": "1}"}))
    raw += stream.feed(part(1, {"arguments": '{"orphan": true}'}))  # a name never comes
    raw += stream.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": None})
    raw += stream.finish()
    events = SSEDecoder().feed(raw)
    for e in events:
        EVENTS.validate_python(e)
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert [(b["id"], b["name"]) for b in starts] == [("functions.f:0", "f"), ("toolu_1", "unknown")]
    assert [b["input"] for b in stream.message["content"]] == [{"p": 1}, {"orphan": True}]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_thinking_then_text_then_thinking_are_three_blocks_each_signed_thinking_stopped() -> None:
    stream = MessagesStream(M.to_chat(body_for()), "msg_1")
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "a"}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "c"}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}},
    ]
    _, events = stream_all(M.to_chat(body_for()), chunks)
    _well_formed(events)
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == [
        "thinking",
        "text",
        "thinking",
    ]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == 3 and events[-2]["usage"]["input_tokens"] == 4
    assert not stream.saw_finish
