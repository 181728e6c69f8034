"""The relay of a translated surface (gateway/surfaces/translated_relay.py): each chat event parsed and fed to a
pure translator (the real ``MessagesStream`` and ``ResponsesStream``), a keep-alive made the surface's own,
the stream finished when the upstream said so and failed otherwise, ``on_start`` and ``done`` around it,
and a stream cancelled through the API ended with the translator's last bytes. Streams run over loopback
(tests/gateway/relay/test_events.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from gateway.relay.proxy import Result
from gateway.surfaces.base import RelayContext
from gateway.surfaces.translate import messages as ms
from gateway.surfaces.translate import responses as rs
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translate.messages_stream import MessagesStream
from gateway.surfaces.translate.responses_stream import ResponsesStream
from gateway.surfaces.translated_relay import TranslatedRelay
from tests.fake_upstream import USAGE, chunk
from tests.gateway.relay.streams import DONE, ROLE, STREAM, WORDS, Sent, sse_answer, upstream_response
from tests.hostile_upstream import chunked_head, frames

PING = MessagesStream.ping()
ENDED_EARLY = "The upstream stream ended before the answer was complete."


class Log:
    """What the relay's callbacks were called with, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def start(self) -> None:
        self.calls.append(("start", None))

    async def done(self, ok: bool) -> None:
        self.calls.append(("done", ok))


def messages_relay(log: Log | None = None, stream: bool = True) -> tuple[TranslatedRelay, MessagesStream | None]:
    req = ms.to_chat({"model": "kimi", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    translator = MessagesStream(req, "msg_1", 3) if stream else None

    def whole(status: int, payload: bytes) -> tuple[int, bytes]:
        if status != 200:
            return ms.reshape_upstream_error(status, payload)
        return 200, orjson.dumps(ms.from_chat(orjson.loads(payload), req, "msg_1"))

    def fail(message: str) -> bytes:
        return translator.fail(message) if translator is not None else b""

    relay = TranslatedRelay(translator, whole, PING, fail, log.done if log else None, None, log.start if log else None)
    return relay, translator


def _ctx(keepalive_s: float = 0) -> tuple[RelayContext, list[int]]:
    firsts: list[int] = []
    return RelayContext(Result(), lambda: firsts.append(1), keepalive_s, []), firsts


def _types(raw: bytes) -> list[str]:
    return [e["type"] for e in SSEDecoder().feed(raw)]


# ---- events ----


def test_each_kind_of_upstream_event() -> None:
    relay, translator = messages_relay()
    assert translator is not None
    assert relay.translate_event(b": keepalive\n\n") == PING
    assert relay.translate_event(b"event: note\nid: 3\n\n") == b""
    assert relay.translate_event(b"data: {not json\n\n") == b""
    assert _types(relay.translate_event(WORDS[0])) == ["message_start", "content_block_start", "content_block_delta"]
    assert not relay.saw_done
    assert relay.translate_event(b"data:  [DONE] \n\n") == b"" and relay.saw_done
    multi = relay.translate_event(b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": "!"}}]}\n\n')
    assert SSEDecoder().feed(multi)[0]["delta"] == {"type": "text_delta", "text": "!"}


def test_the_end_finishes_only_what_the_upstream_said_was_done() -> None:
    finished, _ = messages_relay()
    finished.translate_event(chunk({"content": "a"}, finish="stop"))
    assert _types(finished.finish_stream())[-2:] == ["message_delta", "message_stop"]
    done, _ = messages_relay()
    done.translate_event(chunk({"content": "a"}))
    done.translate_event(DONE)
    assert _types(done.finish_stream())[-1] == "message_stop"
    cut, _ = messages_relay()
    cut.translate_event(chunk({"content": "a"}))
    assert SSEDecoder().feed(cut.finish_stream()) == [
        {"type": "error", "error": {"type": "api_error", "message": ENDED_EARLY}}
    ]


def test_a_whole_answer_is_translated_as_json() -> None:
    relay, _ = messages_relay(stream=False)
    completion = orjson.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": USAGE})
    status, body, ctype = relay.translate_whole(200, completion, b"text/plain")
    assert (status, ctype) == (200, b"application/json") and orjson.loads(body)["content"] == [
        {"type": "text", "text": "hi"}
    ]
    status, body, _ = relay.translate_whole(503, b"busy", b"text/plain")
    assert status == 503 and orjson.loads(body)["error"]["type"] == "overloaded_error"


# ---- streams ----


async def test_a_stream_start_translated_events_and_done() -> None:
    log, sent = Log(), Sent()
    relay, _ = messages_relay(log)
    ctx, firsts = _ctx()

    async def send(message: Any) -> None:
        log.calls.append(("send", message["type"]))
        await sent(message)

    async with upstream_response(sse_answer(STREAM)) as response:
        await relay.stream(response, send, ctx)
    assert log.calls[0] == ("start", None) and log.calls[1] == ("send", "http.response.start")
    assert log.calls[-1] == ("done", True)
    events = SSEDecoder().feed(sent.body)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[-2]["usage"]["output_tokens"] == 7, "the usage chunk reached the translator"
    assert firsts == [1] and ctx.result.usage == USAGE and relay.task is not None


async def test_keepalives_become_the_surfaces_own() -> None:
    relay, _ = messages_relay()
    sent = Sent()
    answer = [
        chunked_head(True) + frames(ROLE),
        0.1,
        frames(WORDS[0]) + frames(chunk({}, finish="stop")) + b"0\r\n\r\n",
    ]
    async with upstream_response(*answer) as response:
        await relay.stream(response, sent, _ctx(keepalive_s=0.04)[0])
    assert PING in sent.body and b": keepalive" not in sent.body
    assert _types(sent.body)[:2] == ["message_start", "ping"]


async def test_a_broken_upstream_fails_the_stream_and_done_hears_it() -> None:
    log, sent = Log(), Sent()
    relay, _ = messages_relay(log)
    ctx, _ = _ctx()
    async with upstream_response(sse_answer(STREAM[:2], end=False), "close") as response:
        await relay.stream(response, sent, ctx)
    events = SSEDecoder().feed(sent.body)
    assert events[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "The upstream connection broke during the stream."},
    }
    assert "message_stop" not in [e["type"] for e in events]
    assert ctx.result.stream_error == "stream_broken" and log.calls[-1] == ("done", False)


async def test_an_upstream_that_ends_without_a_finish_fails_the_stream() -> None:
    log, sent = Log(), Sent()
    relay, _ = messages_relay(log)
    async with upstream_response(sse_answer(STREAM[:3])) as response:
        await relay.stream(response, sent, _ctx()[0])
    assert SSEDecoder().feed(sent.body)[-1]["error"]["message"] == ENDED_EARLY
    assert log.calls[-1] == ("done", False)


def _responses_relay(log: Log) -> tuple[TranslatedRelay, ResponsesStream]:
    req = rs.to_chat({"model": "kimi", "input": "hi", "stream": True})
    translator = ResponsesStream(req, "resp_1", 1.0)
    relay = TranslatedRelay(
        translator,
        lambda status, payload: (status, payload),
        b": keepalive\n\n",
        translator.fail,
        log.done,
        lambda: translator.fail("The response was cancelled.", "cancelled"),
        log.start,
    )
    return relay, translator


async def test_a_cancel_through_the_api_ends_the_stream_with_the_translators_last_bytes() -> None:
    log, sent = Log(), Sent()
    relay, translator = _responses_relay(log)
    async with upstream_response(chunked_head(True) + frames(ROLE) + frames(WORDS[0])) as response:
        task = asyncio.ensure_future(relay.stream(response, sent, _ctx()[0]))
        while b"output_text.delta" not in sent.body:
            await asyncio.sleep(0.005)
        assert relay.task is task
        relay.cancel_requested = True
        task.cancel()
        await asyncio.wait_for(task, 2)  # not raised: the cancel was the API's, not the client leaving
    assert sent.finished and _types(sent.bodies[-1]) == ["error", "response.failed"]
    assert translator.response is not None and translator.response["status"] == "failed"
    assert log.calls[-1] == ("done", False)


async def test_a_client_that_leaves_cancels_the_stream_and_done_still_runs() -> None:
    log, sent = Log(), Sent()
    relay, _ = _responses_relay(log)
    async with upstream_response(chunked_head(True) + frames(WORDS[0])) as response:
        task = asyncio.ensure_future(relay.stream(response, sent, _ctx()[0]))
        while b"output_text.delta" not in sent.body:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not sent.finished and log.calls[-1] == ("done", False)


async def test_a_whole_answer_reports_done() -> None:
    log = Log()
    relay, _ = messages_relay(log, stream=False)
    sent = Sent()
    completion = orjson.dumps({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": USAGE})
    await relay.whole(200, completion, b"application/json", sent, _ctx()[0])
    assert sent.status == 200 and orjson.loads(sent.body)["type"] == "message"
    await relay.whole(500, b"boom", b"text/plain", Sent(), _ctx()[0])
    assert log.calls == [("done", True), ("done", False)], "on_start is for streams only"
