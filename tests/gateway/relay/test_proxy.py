"""What the upstream hop learns from an answer (gateway/relay/proxy.py): ``Result``'s token counts,
``StreamWatch`` over each SSE event (first token, output chunks, finish, usage, model, in-stream error,
the usage chunk the gateway asked for dropped), a whole body read from the lean client over loopback,
and a whole response sent in one write or as two ASGI messages.

(tests/gateway/test_proxy.py is the end-to-end suite of the OpenAI proxy as a process.)"""

from __future__ import annotations

import orjson
import pytest
from starlette.types import Message

from gateway.relay.proxy import Result, StreamWatch, WholeSend, read_body, read_usage, send_bytes, send_whole
from tests.fake_upstream import SERVED, USAGE, chunk
from tests.gateway.relay.streams import Sent, upstream_response
from tests.hostile_upstream import chunked_head, frames


def _watch(strip: bool = True) -> tuple[StreamWatch, list[float]]:
    calls: list[float] = []
    result = Result()
    return StreamWatch(result, strip, lambda: calls.append(result.first_token_at or 0.0)), calls


# ---- Result ----


def test_token_counts_from_usage() -> None:
    assert (Result().prompt_tokens, Result().completion_tokens, Result().cached_tokens) == (0, 0, 0)
    full = Result(usage=USAGE)
    assert (full.prompt_tokens, full.completion_tokens, full.cached_tokens) == (11, 7, 5)
    odd = Result(usage={"prompt_tokens": None, "completion_tokens": "3", "prompt_tokens_details": "n/a"})
    assert (odd.prompt_tokens, odd.completion_tokens, odd.cached_tokens) == (0, 3, 0)
    assert Result(usage={"prompt_tokens_details": None}).cached_tokens == 0


# ---- StreamWatch ----


def test_the_first_generated_delta_is_the_first_token_once() -> None:
    watch, calls = _watch()
    assert watch.forward(chunk({"role": "assistant", "content": ""}))
    assert watch.result.first_token_at is None and calls == [], "a role chunk generates nothing"
    for word in ("a", "b", "c"):
        assert watch.forward(chunk({"content": word}))
    result = watch.result
    assert calls == [result.first_token_at] and result.output_chunks == 3
    assert result.last_token_at is not None and result.last_token_at >= result.first_token_at  # type: ignore[operator]
    assert result.response_model == SERVED


@pytest.mark.parametrize(
    "event",
    [
        chunk({"reasoning_content": "hm"}),
        chunk({"reasoning": "hm"}),
        chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}),
        b'data: {"choices":[{"index":0,"text":"completion","finish_reason":null}]}\n\n',
    ],
)
def test_what_counts_as_generated(event: bytes) -> None:
    watch, calls = _watch()
    assert watch.forward(event) and len(calls) == 1 and watch.result.output_chunks == 1


def test_finish_reasons_and_usage_and_the_injected_usage_chunk() -> None:
    watch, _ = _watch(strip=True)
    watch.forward(chunk({"content": "x"}))
    assert watch.forward(chunk({}, finish="length"))
    assert watch.result.finish_reasons == ["length"]
    assert not watch.forward(chunk(usage=USAGE, choices=False)), "the gateway's own usage chunk is dropped"
    assert watch.result.usage == USAGE
    kept, _ = _watch(strip=False)
    assert kept.forward(chunk(usage=USAGE, choices=False)) and kept.result.usage == USAGE


def test_usage_on_a_chunk_with_choices_is_read_and_forwarded() -> None:
    watch, _ = _watch(strip=True)
    assert watch.forward(chunk({"content": "x"}, finish="stop", usage=USAGE))
    assert watch.result.usage == USAGE and watch.result.finish_reasons == ["stop"]
    assert watch.forward(chunk({"content": "y"}, usage=None)) and watch.result.usage == USAGE  # null changes nothing


@pytest.mark.parametrize(
    "event", [b"data: [DONE]\n\n", b": keepalive\n\n", b"data: {not json\n\n", b"data: [1, 2]\n\n", b"event: x\n\n"]
)
def test_what_is_not_a_chunk_is_forwarded_untouched(event: bytes) -> None:
    watch, calls = _watch()
    assert watch.forward(event)
    assert watch.result == Result() and calls == []


def test_an_in_stream_error_is_noted() -> None:
    watch, _ = _watch()
    assert watch.forward(b'data: {"error": {"message": "engine died", "code": 500}}\n\n')
    assert watch.result.stream_error is not None and "engine died" in watch.result.stream_error


def test_after_the_first_token_an_ordinary_chunk_is_counted_without_parsing() -> None:
    watch, _ = _watch()
    watch.forward(chunk({"content": "a"}))
    # Not JSON past its prefix: only the byte scan could have counted it.
    assert watch.forward(b'data: {"choices":[{"delta":{"content":"b"},"finish_reason":null}]} garbage\n\n')
    assert watch.result.output_chunks == 2


def test_a_multi_line_data_event_is_joined() -> None:
    watch, _ = _watch()
    assert watch.forward(b'data: {"model": "m",\ndata: "choices": [{"delta": {"content": "x"}}]}\n\n')
    assert watch.result.first_token_at is not None and watch.result.response_model == "m"


# ---- whole bodies ----


async def test_read_body_reads_a_whole_answer() -> None:
    body = orjson.dumps({"choices": [{"message": {"content": "x" * 5000}}]})
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    async with upstream_response(head + body[:100], 0.01, body[100:]) as response:
        assert await read_body(response) == body


async def test_read_body_skips_keepalives_and_stops_at_the_limit() -> None:
    body = b"y" * 300
    answer = [chunked_head(False) + frames(body[:64]), 0.08, frames(body[64:]) + b"0\r\n\r\n"]
    async with upstream_response(*answer) as response:
        response.watch_silence(0.02)  # a silence while reading a whole body is not data
        assert await read_body(response) == body
    async with upstream_response(*answer) as response:
        got = await read_body(response, limit=100)
    assert len(got) <= 100 and body.startswith(got)


async def test_send_bytes_as_two_messages_on_a_plain_send() -> None:
    sent = Sent()
    await send_bytes(sent, 201, b'{"ok":1}', b"application/json", [(b"x-request-id", b"cg-1")])
    assert sent.messages == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"8"), (b"x-request-id", b"cg-1")],
        },
        {"type": "http.response.body", "body": b'{"ok":1}', "more_body": False},
    ]
    assert not send_whole(sent, 200, b"", b"text/plain", [])


class _Whole(WholeSend):
    __slots__ = ("can", "messages", "wrote")

    def __init__(self, can: bool) -> None:
        self.can = can
        self.wrote: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        if self.can:
            self.wrote.append((status, headers, body))
        return self.can


async def test_send_bytes_in_one_write_where_the_send_can() -> None:
    send = _Whole(can=True)
    await send_bytes(send, 200, b"{}", b"application/json", [(b"x-a", b"1")])
    assert send.wrote == [(200, [(b"content-type", b"application/json"), (b"x-a", b"1")], b"{}")]
    assert send.messages == []
    busy = _Whole(can=False)  # cannot now: the messages after all
    await send_bytes(busy, 200, b"{}", b"application/json", [])
    assert [m["type"] for m in busy.messages] == ["http.response.start", "http.response.body"]


async def test_the_base_whole_send_never_writes_at_once() -> None:
    with pytest.raises(NotImplementedError):
        await WholeSend()({"type": "http.response.start"})
    assert WholeSend().whole(200, [], b"") is False


def test_read_usage_of_a_whole_answer() -> None:
    result = Result()
    read_usage(
        orjson.dumps(
            {
                "model": SERVED,
                "usage": USAGE,
                "choices": [{"finish_reason": "stop"}, "junk", {"finish_reason": None}, {"finish_reason": "length"}],
            }
        ),
        result,
    )
    assert (result.usage, result.response_model, result.finish_reasons) == (USAGE, SERVED, ["stop", "length"])
    for body in (b"not json", b"[1]", b'{"usage": 5, "model": 3, "choices": null}'):
        untouched = Result()
        read_usage(body, untouched)
        assert untouched == Result()
