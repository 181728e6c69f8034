"""gateway/request/held.py: ``HeldOpen``, a streamed request's response opened while it still waits,
over a recording ASGI ``send`` and the real chat and Messages surfaces."""

from __future__ import annotations

import asyncio

import orjson
from starlette.types import Message

from gateway.relay.proxy import SSE_HEADERS
from gateway.request.held import HeldOpen
from gateway.surfaces.chat import CHAT
from gateway.surfaces.messages import MessagesSurface


class Recorder:
    """An ASGI ``send`` that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body"]


async def test_a_request_dispatched_before_the_delay_sends_nothing_early() -> None:
    sent = Recorder()
    held = HeldOpen(sent, CHAT, "cg-1", after_s=0.05, every_s=0.05)
    held.start()
    await asyncio.sleep(0)
    await held.stop()
    await asyncio.sleep(0.08)  # past the delay: the cancelled timer never fires
    assert sent.messages == [] and not held.opened
    start = {"type": "http.response.start", "status": 429, "headers": []}
    await held.send(start)
    assert sent.messages == [start], "not opened: the answer goes out as it is, status included"
    assert held.inner is sent


async def test_no_delay_means_never_opened_early() -> None:
    sent = Recorder()
    held = HeldOpen(sent, CHAT, "cg-1", after_s=0.0, every_s=0.05)
    held.start()
    await asyncio.sleep(0.06)
    await held.stop()
    assert sent.messages == [] and not held.opened


async def test_a_long_wait_opens_the_stream_and_keeps_it_alive_until_stopped() -> None:
    sent = Recorder()
    held = HeldOpen(sent, CHAT, "cg-7", after_s=0.01, every_s=0.05)
    held.start()
    await asyncio.sleep(0.14)
    await held.stop()
    assert held.opened
    first = sent.messages[0]
    assert first["type"] == "http.response.start" and first["status"] == 200
    assert first["headers"] == [*SSE_HEADERS, (b"x-request-id", b"cg-7")]
    keepalives = sent.bodies()
    assert 2 <= len(keepalives) <= 4 and set(keepalives) == {CHAT.waiting()}
    assert all(m.get("more_body") for m in sent.messages[1:])
    count = len(sent.messages)
    await asyncio.sleep(0.08)
    assert len(sent.messages) == count, "stopped: no more keep-alives"


async def test_once_opened_a_200_continues_on_the_same_response() -> None:
    sent = Recorder()
    held = HeldOpen(sent, CHAT, "cg-1", after_s=0.01, every_s=1.0)
    held.start()
    await asyncio.sleep(0.03)
    await held.stop()
    before = len(sent.messages)
    await held.send({"type": "http.response.start", "status": 200, "headers": [(b"x", b"y")]})
    assert len(sent.messages) == before, "the status already went out: a second start is swallowed"
    await held.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await held.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert sent.messages[before:] == [
        {"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
        {"type": "http.response.body", "body": b"", "more_body": False},
    ]


async def test_once_opened_an_error_answer_becomes_one_error_event_in_chat_shape() -> None:
    sent = Recorder()
    held = HeldOpen(sent, CHAT, "cg-1", after_s=0.01, every_s=1.0)
    held.start()
    await asyncio.sleep(0.03)
    await held.stop()
    before = len(sent.messages)
    error = orjson.dumps({"error": {"message": "queue full", "code": "team_queue_full"}})
    await held.send({"type": "http.response.start", "status": 429, "headers": [(b"retry-after", b"1")]})
    await held.send({"type": "http.response.body", "body": error[:10], "more_body": True})
    assert len(sent.messages) == before, "the error body is gathered, not sent in parts"
    await held.send({"type": "http.response.body", "body": error[10:], "more_body": False})
    assert sent.messages[before:] == [
        {"type": "http.response.body", "body": b"data: " + error + b"\n\ndata: [DONE]\n\n", "more_body": False}
    ]


async def test_the_messages_surface_waits_with_ping_and_ends_with_its_error_event() -> None:
    surface = MessagesSurface()
    sent = Recorder()
    held = HeldOpen(sent, surface, "cg-1", after_s=0.01, every_s=1.0)
    held.start()
    await asyncio.sleep(0.03)
    await held.stop()
    assert sent.bodies() == [surface.waiting()] and b"ping" in surface.waiting()
    await held.send({"type": "http.response.start", "status": 503, "headers": []})
    await held.send({"type": "http.response.body", "body": b"not json", "more_body": False})
    last = sent.messages[-1]
    assert last["body"] == surface.stream_error(503, b"not json") and not last["more_body"]
    assert last["body"].startswith(b"event: error\n") and b"not json" in last["body"]


def test_the_keepalive_cadence_has_a_floor_and_defaults_to_the_delay() -> None:
    send = Recorder()
    assert HeldOpen(send, CHAT, "r", after_s=2.0, every_s=0.001).every_s == 0.05
    assert HeldOpen(send, CHAT, "r", after_s=2.0, every_s=0.0).every_s == 2.0
    assert HeldOpen(send, CHAT, "r", after_s=2.0, every_s=15.0).every_s == 15.0
