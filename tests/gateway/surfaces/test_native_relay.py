"""The byte-exact relay of a backend's own Responses or Messages answer (gateway/surfaces/native_relay.py):
usage converted to chat's shape, the first token, the finish and the final Response read on the way
without changing a byte; a stream that breaks off or ends unfinished ends with one error event in the
surface's shape and counts as broken; whole answers and upstream errors. Streams run over loopback
(tests/gateway/relay/test_events.py).

(tests/gateway/test_native_broken.py breaks a native stream behind the whole request path.)"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.relay.proxy import Result
from gateway.surfaces.base import RelayContext
from gateway.surfaces.native_relay import NativeRelay, NativeWatch, messages_usage_to_chat, responses_usage_to_chat
from gateway.surfaces.translate import messages as ms
from gateway.surfaces.translate import responses as rs
from gateway.surfaces.translate.common import sse_event
from tests.gateway.relay.streams import Sent, sse_answer, upstream_response

RESPONSE_USAGE = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 4}
CHAT_USAGE = {"prompt_tokens": 30, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 20}}


def _response(status: str, usage: Any = RESPONSE_USAGE) -> dict[str, Any]:
    return {"id": "resp_up", "object": "response", "status": status, "output": [], "usage": usage}


def responses_events(final: str | None = "response.completed") -> list[bytes]:
    events = [
        sse_event("response.created", {"type": "response.created", "response": _response("in_progress", None)}),
        sse_event("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hel"}),
        sse_event("response.output_text.delta", {"type": "response.output_text.delta", "delta": "lo"}),
    ]
    if final:
        status = final.removeprefix("response.")
        events.append(sse_event(final, {"type": final, "response": _response(status)}))
    return events


def messages_events(stop: bool = True) -> list[bytes]:
    start = {"id": "msg_up", "usage": {"input_tokens": 5, "cache_read_input_tokens": 25, "output_tokens": 1}}
    events = [
        sse_event("message_start", {"type": "message_start", "message": start}),
        sse_event(
            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
        ),
        sse_event("ping", {"type": "ping"}),
        sse_event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"text": "Hi"}}),
        sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse_event(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
        ),
    ]
    return [*events, sse_event("message_stop", {"type": "message_stop"})] if stop else events


def _ctx() -> tuple[RelayContext, list[int]]:
    firsts: list[int] = []
    return RelayContext(Result(), lambda: firsts.append(1), 0, [(b"x-request-id", b"cg-1")]), firsts


class Done:
    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any] | None, bool]] = []

    async def __call__(self, final: dict[str, Any] | None, ok: bool) -> None:
        self.calls.append((final, ok))


# ---- usage ----


def test_responses_usage_in_chats_shape() -> None:
    assert responses_usage_to_chat(RESPONSE_USAGE) == CHAT_USAGE
    assert responses_usage_to_chat({"input_tokens": None}) == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert responses_usage_to_chat(None) is None and responses_usage_to_chat("30") is None


def test_messages_usage_adds_the_cache_back_and_merges_over_what_message_start_said() -> None:
    start = messages_usage_to_chat(
        {"input_tokens": 5, "cache_read_input_tokens": 25, "cache_creation_input_tokens": 3, "output_tokens": 1}
    )
    assert start == {"prompt_tokens": 33, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 25}}
    later = messages_usage_to_chat({"output_tokens": 12}, start)
    assert later == {"prompt_tokens": 33, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 25}}
    assert start["completion_tokens"] == 1, "what message_start said is not changed"
    assert messages_usage_to_chat(None, start) is start and messages_usage_to_chat(None) is None


# ---- NativeWatch ----


def test_responses_watch_reads_first_token_and_the_final_response() -> None:
    result, firsts = Result(), []
    watch = NativeWatch(result, lambda: firsts.append(1), "responses")
    for event in responses_events():
        assert watch.forward(event), "a native stream is read, never changed"
    assert firsts == [1] and result.output_chunks == 2
    assert watch.finished and watch.final == _response("completed")
    assert result.usage == CHAT_USAGE and result.finish_reasons == ["completed"]


@pytest.mark.parametrize(("final", "finished"), [("response.incomplete", True), ("response.failed", False)])
def test_responses_watch_other_ends(final: str, finished: bool) -> None:
    watch = NativeWatch(Result(), lambda: None, "responses")
    for event in responses_events(final):
        watch.forward(event)
    assert watch.finished is finished and watch.final is not None and watch.final["status"] == final[9:]


def test_a_function_call_is_a_first_token_and_an_error_event_is_noted() -> None:
    watch = NativeWatch(Result(), lambda: None, "responses")
    added = {"type": "response.output_item.added", "item": {"type": "function_call", "name": "f"}}
    watch.forward(sse_event("response.output_item.added", added))
    assert watch.result.first_token_at is not None
    watch.forward(sse_event("error", {"type": "error", "code": "server_error", "message": "engine died"}))
    assert watch.result.stream_error == "engine died"
    message = NativeWatch(Result(), lambda: None, "responses")
    message.forward(sse_event("x", {"type": "response.output_item.added", "item": {"type": "message"}}))
    assert message.result.first_token_at is None, "an empty message item is not output yet"


def test_messages_watch_reads_usage_stop_reason_and_the_stop() -> None:
    result = Result()
    watch = NativeWatch(result, lambda: None, "messages")
    for event in messages_events():
        watch.forward(event)
    # after the first token an event without usage, error or stop is counted unparsed: the delta and the block stop
    assert result.first_token_at is not None and result.output_chunks == 2
    assert result.usage == {"prompt_tokens": 30, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 25}}
    assert result.finish_reasons == ["end_turn"] and watch.finished and watch.final is None
    tool = NativeWatch(Result(), lambda: None, "messages")
    tool.forward(sse_event("x", {"type": "content_block_start", "content_block": {"type": "tool_use"}}))
    assert tool.result.first_token_at is not None


# ---- the relay ----


async def test_a_native_stream_is_relayed_byte_for_byte() -> None:
    done, sent = Done(), Sent()
    ctx, firsts = _ctx()
    events = responses_events()
    async with upstream_response(sse_answer(events)) as response:
        await NativeRelay("responses", rs.reshape_upstream_error, done).stream(response, sent, ctx)
    assert sent.body == b"".join(events) and (b"x-request-id", b"cg-1") in sent.headers
    assert ctx.result.stream_error is None and firsts == [1] and ctx.result.usage == CHAT_USAGE
    assert done.calls == [(_response("completed"), True)]


BROKE = "The upstream connection broke during the stream."


@pytest.mark.parametrize(
    ("kind", "events", "error"),
    [
        (
            "responses",
            responses_events(None),
            {"type": "error", "code": "upstream_stream_broken", "message": BROKE, "param": None, "sequence_number": 0},
        ),
        ("messages", messages_events(stop=False), {"type": "error", "error": {"type": "api_error", "message": BROKE}}),
    ],
)
async def test_a_broken_native_stream_ends_with_one_error_event_in_the_surfaces_shape(
    kind: str, events: list[bytes], error: dict[str, Any]
) -> None:
    done, sent = Done(), Sent()
    ctx, _ = _ctx()
    async with upstream_response(sse_answer(events, end=False), "close") as response:
        await NativeRelay(kind, rs.reshape_upstream_error, done).stream(response, sent, ctx)
    tail = sent.body.removeprefix(b"".join(events))
    assert tail == sse_event("error", error), "the bytes so far, then one error event (no [DONE])"
    assert ctx.result.stream_error == "stream_broken" and done.calls == [(None, False)]


async def test_a_native_stream_that_ends_unfinished_counts_as_broken() -> None:
    done, sent = Done(), Sent()
    ctx, _ = _ctx()
    events = messages_events(stop=False)
    async with upstream_response(sse_answer(events)) as response:  # a clean end, but no message_stop
        await NativeRelay("messages", ms.reshape_upstream_error, done).stream(response, sent, ctx)
    assert sent.body == b"".join(events), "nothing added: the upstream ended cleanly"
    assert ctx.result.stream_error == "stream_broken" and done.calls == [(None, False)]


async def test_a_whole_native_answer() -> None:
    done, sent = Done(), Sent()
    ctx, firsts = _ctx()
    body = orjson.dumps(_response("completed"))
    await NativeRelay("responses", rs.reshape_upstream_error, done).whole(200, body, b"application/json", sent, ctx)
    assert sent.status == 200 and sent.body == body and ctx.result.usage == CHAT_USAGE and firsts == [1]
    assert done.calls == [(_response("completed"), True)]
    failed = Done()
    await NativeRelay("responses", rs.reshape_upstream_error, failed).whole(
        200, orjson.dumps(_response("failed", None)), b"application/json", Sent(), _ctx()[0]
    )
    assert failed.calls[0][1] is False
    message = orjson.dumps({"type": "message", "usage": {"input_tokens": 2, "output_tokens": 0}})
    ctx, firsts = _ctx()
    await NativeRelay("messages", ms.reshape_upstream_error).whole(200, message, b"application/json", Sent(), ctx)
    assert ctx.result.prompt_tokens == 2 and firsts == [], "no output: no first token"


async def test_a_native_upstream_error_is_reshaped_with_its_status() -> None:
    done, sent = Done(), Sent()
    flat = b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}'
    await NativeRelay("messages", ms.reshape_upstream_error, done).whole(400, flat, b"text/plain", sent, _ctx()[0])
    assert sent.status == 400 and (b"content-type", b"application/json") in sent.headers
    assert orjson.loads(sent.body) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "too long"},
    }
    assert done.calls == []
