"""Responses API ⇄ chat completions: requests, answers and streams, checked with the OpenAI SDK's
own types and accumulator, and over loopback HTTP with the SDK as the client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import NOT_GIVEN
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.errors import GatewayError
from gateway.translate import responses as R
from gateway.translate.common import SSEDecoder
from gateway.translate.responses_stream import ResponsesStream
from tests.translate.chat import Call, SDKServer, Turn, chunks_for, sse, turns

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOOL = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def req_for(**body: Any) -> R.ResponsesRequest:
    return R.to_chat({"model": "kimi", "input": "hi", **body})


def stream_all(req: R.ResponsesRequest, chunks: list[dict[str, Any]]) -> tuple[ResponsesStream, list[dict[str, Any]]]:
    s = ResponsesStream(req, "resp_test", 1700000000.0)
    raw = s.start() + b"".join(s.feed(c) for c in chunks) + s.finish()
    decoder = SSEDecoder()
    events = decoder.feed(raw)
    assert decoder.skipped == 0
    names = [line[7:] for line in raw.split(b"\n") if line.startswith(b"event: ")]
    assert [e["type"].encode() for e in events] == names  # the SSE event name is the payload's type
    return s, events


def back_to_chat(output: list[dict[str, Any]], drop_raw: bool = False) -> list[dict[str, Any]]:
    """A follow-up turn's input: the previous output, then one result per function call.
    ``drop_raw``: resend reasoning items without their raw content, as Codex does."""
    if drop_raw:
        output = [{k: v for k, v in o.items() if k != "content"} if o["type"] == "reasoning" else o for o in output]
    results = [
        {"type": "function_call_output", "call_id": o["call_id"], "output": f"result of {o['call_id']}"}
        for o in output
        if o["type"] == "function_call"
    ]
    return R.to_chat({"model": "kimi", "input": [*output, *results]}).chat["messages"]


def assert_same_turn(message: dict[str, Any], turn: Turn) -> None:
    """The assistant message rebuilt from Responses items says exactly what the upstream said."""
    assert message["role"] == "assistant"
    assert message["content"] == turn.content
    assert message.get("reasoning_content", "") == turn.reasoning
    calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert calls == [(c.id, c.name, c.arguments) for c in turn.calls]


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

PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" body'},
}


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
