"""Responses API ⇄ chat completions: streams, checked with the OpenAI SDK's own types and accumulator,
and over loopback HTTP with the SDK as the client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai import NOT_GIVEN
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.surfaces.translate import responses as R
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translate.responses_stream import ResponsesStream, keepalive
from tests.translate.chat import Call, SDKServer, Turn, chunks_for, sse, turns
from tests.translate.responses_helpers import PATCH_TOOL, PROPS, TOOL, assert_same_turn, back_to_chat, req_for

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


def stream_all(req: R.ResponsesRequest, chunks: list[dict[str, Any]]) -> tuple[ResponsesStream, list[dict[str, Any]]]:
    s = ResponsesStream(req, "resp_test", 1700000000.0)
    raw = s.start() + b"".join(s.feed(c) for c in chunks) + s.finish()
    decoder = SSEDecoder()
    events = decoder.feed(raw)
    assert decoder.skipped == 0
    names = [line[7:] for line in raw.split(b"\n") if line.startswith(b"event: ")]
    assert [e["type"].encode() for e in events] == names  # the SSE event name is the payload's type
    return s, events


@PROPS
@given(st.data())
def test_streamed_answer_round_trips_through_the_sdk_accumulator(data: st.DataObject) -> None:
    turn = data.draw(turns())
    req = req_for(tools=[TOOL], stream=True)
    stream, events = stream_all(req, chunks_for(data.draw, turn))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[TOOL], text_format=NOT_GIVEN)
    final = None
    for raw in events:
        for out in state.handle_event(EVENTS.validate_python(raw)):
            if out.type in ("response.completed", "response.incomplete"):
                final = out.response
    assert final is not None, [e["type"] for e in events]
    assert events[-1]["type"] == ("response.incomplete" if turn.finish == "length" else "response.completed")
    Response.model_validate(stream.response)
    if turn.finish != "length":  # the SDK keeps its own parse of a completed response
        assert final.output_text == turn.content
    assert_same_turn(back_to_chat(stream.output, drop_raw=data.draw(st.booleans()))[0], turn)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == "".join(c.arguments for c in turn.calls)
    assert (
        stream.response["usage"]["input_tokens_details"]["cached_tokens"]
        == turn.usage["prompt_tokens_details"]["cached_tokens"]
    )


def test_reasoning_summary_mode_mirrors_the_trace() -> None:
    req = req_for(reasoning={"effort": "high", "summary": "auto"})
    assert req.chat["reasoning_effort"] == "high"
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "a"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "b"}, "finish_reason": "stop"}]},
    ]
    stream, events = stream_all(req, chunks)
    kinds = [e["type"] for e in events]
    assert "response.reasoning_summary_text.delta" in kinds and "response.reasoning_text.delta" not in kinds
    for e in events:
        EVENTS.validate_python(e)
    item = stream.response["output"][0]
    assert item["summary"] == [{"type": "summary_text", "text": "ab"}]
    assert item["content"] == [{"type": "reasoning_text", "text": "ab"}]


def test_created_comes_before_any_upstream_chunk_and_only_once() -> None:
    stream = ResponsesStream(req_for(stream=True), "resp_1", 5.0)
    first = SSEDecoder().feed(stream.start())
    assert [e["type"] for e in first] == ["response.created", "response.in_progress"]
    assert first[0]["response"]["status"] == "in_progress" and first[0]["response"]["id"] == "resp_1"
    later = SSEDecoder().feed(stream.feed({"choices": [{"index": 0, "delta": {"content": "x"}}]}))
    assert "response.created" not in [e["type"] for e in later]
    assert later[0]["sequence_number"] == 2


def test_broken_stream_ends_with_error_and_failed() -> None:
    stream = ResponsesStream(req_for(stream=True), "resp_1", 5.0)
    raw = stream.start() + stream.feed({"choices": [{"index": 0, "delta": {"content": "par"}}]})
    raw += stream.feed({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}})
    events = SSEDecoder().feed(raw)
    for e in events:
        EVENTS.validate_python(e)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.error is not None and failed.error.message == "engine died"
    assert failed.output[0].content[0].text == "par"  # type: ignore[union-attr]
    assert stream.finish() == b"" and stream.fail("again") == b""


def test_late_fragment_of_an_earlier_call_is_kept() -> None:
    def call(i: int, args: str, name: str | None = None) -> dict[str, Any]:
        fn = {"arguments": args} | ({"name": name} if name else {})
        return {
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": i, "id": f"functions.f:{i}"} | {"function": fn}]}}
            ]
        }

    chunks = [
        call(0, '{"a"', "f"),
        call(1, '{"b": 2}', "g"),
        call(0, ": 1}"),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    stream, events = stream_all(req_for(), chunks)
    for e in events:
        EVENTS.validate_python(e)
    assert [(o["call_id"], o["arguments"]) for o in stream.response["output"]] == [
        ("functions.f:0", '{"a": 1}'),
        ("functions.f:1", '{"b": 2}'),
    ]


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


def fixed_chunks(turn: Turn) -> list[dict[str, Any]]:
    """The chunks for ``turn`` with every text in one piece (a draw that never cuts)."""
    return chunks_for(lambda _strategy: [], turn)  # type: ignore[arg-type,return-value]


def test_openai_sdk_create_and_stream(server: SDKServer) -> None:
    async def handler(request: Request) -> Any:
        req = R.to_chat(R.load_body(await request.body()))
        if not req.stream:
            return JSONResponse(R.from_chat(TOOL_TURN.completion(), req, "resp_sdk", 1.0))
        stream = ResponsesStream(req, "resp_sdk", 1.0)
        return sse(iter([stream.start(), *(stream.feed(c) for c in fixed_chunks(TOOL_TURN)), stream.finish()]))

    server.handler = handler
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    created = client.responses.create(model="kimi", input="read the readme", tools=[TOOL])  # type: ignore[list-item]
    assert created.output_text == "Reading it."
    call = next(o for o in created.output if o.type == "function_call")
    assert (call.call_id, call.arguments) == ("functions.read_file:0", '{"path": "README.md"}')
    assert created.usage is not None and created.usage.input_tokens_details.cached_tokens == 100

    with client.responses.stream(model="kimi", input="read the readme", tools=[TOOL]) as stream:  # type: ignore[list-item]
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Reading it." and final.output_text == "Reading it."
    streamed_call = next(o for o in final.output if o.type == "function_call")
    assert (streamed_call.call_id, streamed_call.arguments) == ("functions.read_file:0", '{"path": "README.md"}')
    assert server.requests[-1]["body"]["stream"] is True


# ---- custom (freeform) tools, as Codex's apply_patch ----


@PROPS
@given(st.data())
def test_custom_tool_calls_round_trip_streamed_and_not(data: st.DataObject) -> None:
    patch = data.draw(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80))
    arguments = orjson.dumps({"input": patch}).decode()
    turn = Turn(
        content=data.draw(st.sampled_from(["", "Patching."])),
        calls=[Call("functions.apply_patch:0", "apply_patch", arguments)],
        finish="tool_calls",
        usage={"prompt_tokens": 10, "completion_tokens": 3},
    )
    req = req_for(tools=[PATCH_TOOL], stream=True)
    whole = R.from_chat(turn.completion(), req, "resp_c", 1.0)
    stream, events = stream_all(req, chunks_for(data.draw, turn))
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=NOT_GIVEN, text_format=NOT_GIVEN)
    for raw in events:
        state.handle_event(EVENTS.validate_python(raw))
    for response in (whole, stream.response):
        parsed = Response.model_validate(response)
        call = parsed.output[-1]
        assert call.type == "custom_tool_call" and (call.call_id, call.input) == ("functions.apply_patch:0", patch)
        again = R.to_chat({"model": "kimi", "tools": [PATCH_TOOL], "input": response["output"]}).chat["messages"]
        assert orjson.loads(again[0]["tool_calls"][0]["function"]["arguments"]) == {"input": patch}
    done = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert [e["input"] for e in done] == [patch]


# ---- edges ----


def test_an_empty_answer_is_one_empty_message_and_then_nothing_more() -> None:
    stream = ResponsesStream(req_for(stream=True), "resp_1", 5.0)
    events = SSEDecoder().feed(stream.finish())
    for e in events:
        EVENTS.validate_python(e)
    assert [e["type"] for e in events][:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert events[-1]["type"] == "response.completed"
    (item,) = stream.response["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == ""
    assert stream.finish() == b"" and stream.fail("late") == b"" and stream.start() == b""
    assert stream.feed({"choices": [{"index": 0, "delta": {"content": "late"}}]}) == b""


def test_output_so_far_is_in_progress_until_the_end() -> None:
    stream = ResponsesStream(req_for(stream=True), "resp_1", 5.0)
    stream.feed({"choices": [{"index": 0, "delta": {"content": "par"}}]})
    assert [(o["type"], o["status"], o["content"][0]["text"]) for o in stream.output] == [
        ("message", "in_progress", "par")
    ]
    assert not stream.finished and stream.response is None
    stream.feed({"choices": [{"index": 0, "delta": {"content": "tial"}, "finish_reason": "length"}]})
    events = SSEDecoder().feed(stream.finish())
    assert events[-1]["type"] == "response.incomplete"
    assert [(o["status"], o["content"][0]["text"]) for o in stream.output] == [("incomplete", "partial")]
    assert stream.response["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize(
    ("code", "failed"),
    [
        ("rate_limit_exceeded", "rate_limit_exceeded"),
        ("upstream_timeout", "server_error"),
        ("cancelled", "server_error"),
    ],
)
def test_a_failure_keeps_its_code_in_the_error_event_and_the_sdks_set_in_the_response(code: str, failed: str) -> None:
    stream = ResponsesStream(req_for(stream=True), "resp_1", 5.0)
    events = SSEDecoder().feed(stream.fail("why", code))
    assert events[-2] == {"type": "error", "sequence_number": 2, "code": code, "message": "why", "param": None}
    assert events[-1]["response"]["error"] == {"code": failed, "message": "why"}
    Response.model_validate(events[-1]["response"])


def test_arguments_before_the_calls_name_wait_for_it_and_a_nameless_call_is_still_delivered() -> None:
    def part(i: int, fn: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
        call = {"index": i, "function": fn} | ({"id": call_id} if call_id else {})
        return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    stream = ResponsesStream(req_for(tools=[TOOL]), "resp_1", 5.0)
    stream.start()
    assert stream.feed(part(0, {"arguments": '{"p": '})) == b""  # no name yet: held
    stream.feed(part(0, {"name": "read_file", "arguments": "1}"}, "functions.read_file:0"))
    stream.feed(part(1, {"arguments": "{}"}))  # a name never comes
    stream.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    stream.finish()
    assert [(o["call_id"], o["name"], o["arguments"]) for o in stream.response["output"]] == [
        ("functions.read_file:0", "read_file", '{"p": 1}'),
        (stream.response["output"][1]["call_id"], "unknown", "{}"),
    ]
    assert stream.response["output"][1]["call_id"].startswith("call_")
    Response.model_validate(stream.response)


def test_keepalive_is_a_comment() -> None:
    assert keepalive() == b": keepalive\n\n"
    assert SSEDecoder().feed(keepalive()) == []
