"""backends/sim/disagg_asgi.py: the disaggregated twin's ASGI plumbing on plain ``receive``/``send``
callables: a watched ``receive`` (work done, timed out, or the client left first), the decode
answer's ``cached_tokens`` rewrite (whole answers re-measured, streams chunk by chunk), body reads and
replays, and a JSON answer."""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import Message

from backends.sim.disagg_asgi import Watch, cached_from, read_body, replay, replay_messages, send_json


class Client:
    """A request's ``receive``: the body parts, then nothing until :meth:`leave`."""

    def __init__(self, *parts: bytes) -> None:
        self.parts = list(parts)
        self.gone = asyncio.Event()
        self.calls = 0

    async def receive(self) -> Message:
        self.calls += 1
        if self.parts:
            body = self.parts.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.parts)}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    def leave(self) -> None:
        self.gone.set()


class Sink:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])


async def test_until_reports_work_that_ends_first() -> None:
    client = Client()
    watch = Watch(client.receive)

    async def work() -> None:
        await asyncio.sleep(0.01)

    assert await watch.until(work(), 1.0) == "ok" and not watch.gone


async def test_until_reports_a_timeout_and_cancels_the_work() -> None:
    watch = Watch(Client().receive)
    job = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            job.set()
            raise

    assert await watch.until(work(), 0.02) == "timeout"
    assert job.is_set() and not watch.gone


async def test_until_reports_a_client_that_leaves_and_receive_then_gives_its_disconnect() -> None:
    client = Client()
    watch = Watch(client.receive)
    asyncio.get_running_loop().call_later(0.02, client.leave)
    assert await watch.until(asyncio.sleep(10), 5.0) == "left" and watch.gone
    assert await watch.receive() == {"type": "http.disconnect"}
    assert client.calls == 1  # the receive until() started was handed on, not called again


async def test_a_watched_receive_picks_up_the_read_until_started() -> None:
    client = Client()
    watch = Watch(client.receive)
    assert await watch.until(asyncio.sleep(0), 1.0) == "ok"
    client.leave()
    assert await asyncio.wait_for(watch.receive(), 1) == {"type": "http.disconnect"} and watch.gone
    assert client.calls == 1


async def test_the_cached_tokens_of_a_whole_answer_are_rewritten_and_its_length_follows() -> None:
    sink = Sink()
    send = cached_from(sink, 1234)
    body = orjson.dumps({"usage": {"prompt_tokens_details": {"cached_tokens": 7}}, "cache_read_input_tokens": 0})
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    assert sink.messages == []  # held until the body is whole
    await send({"type": "http.response.body", "body": body[:20], "more_body": True})
    await send({"type": "http.response.body", "body": body[20:], "more_body": False})
    got = orjson.loads(sink.body())
    assert got == {"usage": {"prompt_tokens_details": {"cached_tokens": 1234}}, "cache_read_input_tokens": 1234}
    assert int(sink.headers()[b"content-length"]) == len(sink.body())


async def test_a_streamed_answer_is_rewritten_chunk_by_chunk() -> None:
    sink = Sink()
    send = cached_from(sink, 99)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b'data: {"cached_tokens": 3}\n\n', "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
    assert [m["type"] for m in sink.messages] == ["http.response.start", "http.response.body", "http.response.body"]
    assert sink.body() == b'data: {"cached_tokens": 99}\n\ndata: [DONE]\n\n'


async def test_read_body_joins_the_parts_and_replay_gives_them_back_then_the_client() -> None:
    client = Client(b'{"a"', b": 1}")
    raw = await read_body(client.receive)
    assert raw == b'{"a": 1}'
    again = replay(b'{"b": 2}', client.receive)
    assert await again() == {"type": "http.request", "body": b'{"b": 2}', "more_body": False}
    client.leave()
    assert await again() == {"type": "http.disconnect"}


async def test_send_json_and_replay_messages() -> None:
    sink = Sink()
    await send_json(sink, 400, {"message": "no"})
    assert sink.messages[0]["status"] == 400 and sink.headers()[b"content-type"] == b"application/json"
    assert orjson.loads(sink.body()) == {"message": "no"} and sink.headers()[b"content-length"] == b"16"
    copy = Sink()
    await replay_messages(sink.messages, copy)
    assert copy.messages == sink.messages
