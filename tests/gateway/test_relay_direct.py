"""The callback relay's per-chunk paths (gateway/http/wire.py ``WireResponse.direct``, gateway/relay/events.py
``_relay_direct``), driven without sockets: the same upstream stream cut into reads every way (one
frame per read, several per read, frames split anywhere, upper-case sizes, CRLF and multi-line
events) must reach the client byte for byte as the task relay sends it, with the same accounting."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gateway.http.wire import WireResponse
from gateway.relay.events import SseFilter, relay_events
from gateway.relay.proxy import Result, StreamWatch
from tests.fake_upstream import USAGE, chunk

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENTS = [
    chunk({"role": "assistant", "content": ""}),
    *(chunk({"content": f"t{i} "}) for i in range(12)),
    b'event: note\ndata: {"x":1}\n\n',
    chunk({"content": "crlf"})[:-2] + b"\r\n\r\n",
    *(chunk({"content": f"u{i} "}) for i in range(5)),
    chunk({}, finish="stop"),
    chunk(usage=USAGE, choices=False),
    b"data: [DONE]\n\n",
]


class _Pool:
    idle_s = 30.0

    def put_back(self, _: Any) -> None: ...

    def release(self) -> None: ...


class _Transport:
    def __init__(self) -> None:
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


class _Client:
    on_writable = None

    def __init__(self) -> None:
        self.transport = _Transport()

    def direct_transport(self) -> Any:
        return self.transport

    def writing_paused(self) -> bool:
        return False


def _dechunk(raw: bytes) -> bytes:
    """Strict: every frame well formed, canonical or not."""
    out, pos = [], 0
    while pos < len(raw):
        i = raw.index(b"\r\n", pos)
        size = int(raw[pos:i], 16)
        assert raw[i + 2 + size : i + 4 + size] == b"\r\n"
        out.append(raw[i + 2 : i + 2 + size])
        pos = i + 4 + size
    return b"".join(out)


def _frames(events: list[bytes], upper: bool) -> list[bytes]:
    return [(b"%X\r\n%s\r\n" if upper else b"%x\r\n%s\r\n") % (len(e), e) for e in events]


def _reads(frames: list[bytes], how: str, rng: random.Random) -> list[bytes]:
    if how == "one per read":
        return frames
    if how == "several per read":
        reads, i = [], 0
        while i < len(frames):
            k = rng.randint(1, 4)
            reads.append(b"".join(frames[i : i + k]))
            i += k
        return reads
    wire = b"".join(frames)  # cut anywhere
    cuts = sorted(rng.sample(range(1, len(wire)), 40))
    return [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]


async def _relay(reads: list[bytes], sse: type[SseFilter], strip: bool, direct: bool) -> tuple[bytes, Result, int]:
    response = WireResponse(_Pool(), ("http", "x", 1))  # type: ignore[arg-type]
    response.connection_made(_Transport())  # type: ignore[arg-type]
    response.data_received(HEAD)
    result, client, sent = Result(), _Client(), []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    task = asyncio.ensure_future(
        relay_events(response, send, sse(StreamWatch(result, strip, lambda: None)), 0, [], client if direct else None)
    )
    await asyncio.sleep(0)
    for data in reads:
        response.data_received(data)
        await asyncio.sleep(0)
    response.data_received(b"0\r\n\r\n")
    await task
    body = _dechunk(b"".join(client.transport.data)) + b"".join(sent)
    return body, result, len(client.transport.data)


class Shout(SseFilter):
    """A filter that only changes ``events``: its ``one`` must go through it."""

    def events(self, events: bytes, now: float) -> bytes:
        return events.replace(b"content", b"CONTENT")


@pytest.mark.parametrize("how", ["one per read", "several per read", "cut anywhere"])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("sse", [SseFilter, Shout])
@pytest.mark.parametrize("strip", [True, False])
async def test_direct_relay_matches_the_task_relay(how: str, upper: bool, sse: type[SseFilter], strip: bool) -> None:
    reads = _reads(_frames(EVENTS, upper), how, random.Random(7))
    body, result, writes = await _relay(reads, sse, strip, direct=True)
    ref_body, ref, _ = await _relay(reads, sse, strip, direct=False)
    if sse is Shout:  # no accounting, nothing stripped: every event, changed
        expected = b"".join(EVENTS).replace(b"content", b"CONTENT")
    else:
        expected = b"".join(e for e in EVENTS if not (strip and e == EVENTS[-2]))
        assert result.usage == USAGE and result.finish_reasons == ["stop"] and result.first_token_at is not None
        assert result.output_chunks == 18  # the content chunks (the role chunk has no text)
    assert body == ref_body == expected
    assert (result.usage, result.finish_reasons, result.output_chunks) == (
        ref.usage,
        ref.finish_reasons,
        ref.output_chunks,
    )
    assert result.client_bytes == ref.client_bytes == len(expected)
    if how != "cut anywhere":
        assert writes <= len(reads), "what arrives in one read leaves in one write"


async def test_a_passed_frame_is_the_upstreams_own() -> None:
    frames = _frames(EVENTS[:10], upper=False)
    response = WireResponse(_Pool(), ("http", "x", 1))  # type: ignore[arg-type]
    response.connection_made(_Transport())  # type: ignore[arg-type]
    response.data_received(HEAD + frames[0])
    client = _Client()

    async def send(message: dict[str, Any]) -> None: ...

    task = asyncio.ensure_future(
        relay_events(response, send, SseFilter(StreamWatch(Result(), True, lambda: None)), 0, [], client)
    )
    await asyncio.sleep(0)
    for frame in frames[1:]:
        response.data_received(frame)
    response.data_received(b"0\r\n\r\n")
    await task
    assert any(w is f for w in client.transport.data for f in frames[2:]), "the upstream's frame itself, no copy"
    assert b"".join(client.transport.data) == b"".join(frames)
