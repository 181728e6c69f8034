"""The one SSE relay loop (gateway/relay/events.py) over real HTTP on loopback: an upstream on this test's
event loop plays scripted bytes, the lean client (gateway/http/wire.py) reads them, and ``relay_events``
sends the client what its ``SseFilter`` makes of them: whole events as they arrive, keep-alives in
silences, one error event when the upstream breaks off, times out or answers malformed HTTP, and on
callbacks straight to the client's connection where the server lends it.

The scripted upstreams are ``tests/gateway/relay/streams.py``'s."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from gateway.http.wire import SILENCE, UpstreamMalformed
from gateway.relay.events import MALFORMED, SseFilter, broken_stream, relay_events, relay_sse, split_events
from gateway.relay.proxy import SSE_HEADERS, Result, StreamWatch
from tests.fake_upstream import USAGE
from tests.gateway.relay.streams import (
    END,
    ROLE,
    STREAM,
    USAGE_ONLY,
    WORDS,
    Sent,
    Step,
    error_event,
    sse_answer,
    upstream_response,
    watch,
)
from tests.hostile_upstream import chunked_head, frames

# ---- events ----


def test_split_events() -> None:
    assert split_events(WORDS[0]) == [WORDS[0]]
    assert split_events(b"".join(WORDS)) == WORDS
    crlf = [b"data: 1\r\n\r\n", b"event: x\r\ndata: 2\r\n\r\n", b"data: 3\n\n"]
    assert split_events(b"".join(crlf)) == crlf
    assert split_events(b"event: a\ndata: {}\n\n: comment\n\n") == [b"event: a\ndata: {}\n\n", b": comment\n\n"]


def test_the_base_filter_is_chats_byte_exact_passthrough() -> None:
    sse = SseFilter(watch(strip=True))
    assert sse.start() == b"" and sse.silence() is SILENCE and sse.end(b"data: {") == b"data: {"
    whole = b"".join(STREAM)
    out = sse.events(whole, 1.0)
    assert out == whole.replace(USAGE_ONLY, b""), "only the usage chunk the gateway asked for is dropped"
    result = sse.result
    assert (result.usage, result.finish_reasons, result.output_chunks) == (USAGE, ["stop"], 3)
    kept = SseFilter(watch(strip=False))
    assert kept.events(whole, 1.0) is whole, "nothing dropped: the bytes as they came, not a copy"


def test_one_event_takes_the_byte_scan_after_the_first_token() -> None:
    sse = SseFilter(watch())
    for event in (ROLE, WORDS[0]):
        assert sse.one(event, 1.0) is event
    assert sse.result.first_token_at is not None
    assert sse.one(WORDS[1], 2.0) is WORDS[1] and sse.result.last_token_at == 2.0  # the scan's ``now``
    assert sse.one(USAGE_ONLY, 3.0) == b"" and sse.result.usage == USAGE
    assert sse.result.output_chunks == 2


def test_broken_is_chats_error_event_then_done() -> None:
    raw = SseFilter(watch()).broken(504, "silent", "upstream_timeout")
    assert error_event(raw) == {"message": "silent", "type": "timeout_error", "param": None, "code": "upstream_timeout"}


def test_a_filter_that_only_changes_events_gets_a_one_that_goes_through_them() -> None:
    class Upper(SseFilter):
        def events(self, events: bytes, now: float) -> bytes:
            return events.upper()

    class Both(Upper):
        def one(self, event: bytes, now: float) -> bytes:
            return b"one"

    assert Upper(watch()).one(WORDS[0], 1.0) == WORDS[0].upper()
    assert Both(watch()).one(WORDS[0], 1.0) == b"one"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ReadTimeout("x"), ("timeout", 504, "upstream_timeout")),
        (httpx.ConnectTimeout("x"), ("timeout", 504, "upstream_timeout")),
        (UpstreamMalformed("x"), ("malformed", 502, MALFORMED)),
        (httpx.RemoteProtocolError("x"), ("stream_broken", 502, "upstream_stream_broken")),
        (httpx.ReadError("x"), ("stream_broken", 502, "upstream_stream_broken")),
    ],
)
def test_broken_stream_kinds(exc: httpx.HTTPError, expected: tuple[str, int, str]) -> None:
    kind, status, message, code = broken_stream(exc)
    assert (kind, status, code) == expected and message


# ---- the task relay, over loopback ----


async def test_a_stream_relayed_whole_with_its_accounting() -> None:
    firsts: list[int] = []
    sse = SseFilter(watch(on_first=lambda: firsts.append(1)))
    sent = Sent()
    extra = [(b"x-request-id", b"cg-1")]
    async with upstream_response(sse_answer(STREAM)) as response:
        await relay_events(response, sent, sse, 0, extra)
    assert sent.status == 200 and sent.headers == SSE_HEADERS + extra
    assert sent.body == b"".join(e for e in STREAM if e != USAGE_ONLY) and sent.finished
    result = sse.result
    assert firsts == [1] and result.usage == USAGE and result.finish_reasons == ["stop"]
    assert result.response_model == "served/kimi" and result.stream_error is None
    assert result.client_bytes == len(sent.body)


async def test_events_cut_anywhere_leave_whole() -> None:
    wire = b"".join(STREAM)
    pieces: list[Step] = [chunked_head(True)]
    for i in range(0, len(wire), 37):  # frames cut across events, each its own write
        pieces += [frames(wire[i : i + 37]), 0.002]
    sent = Sent()
    async with upstream_response(*pieces, END) as response:
        await relay_events(response, sent, SseFilter(watch(strip=False)), 0, [])
    assert sent.body == wire
    assert all(body.endswith(b"\n\n") for body in sent.bodies if body), "only whole events go out"


async def test_start_bytes_go_first_and_count() -> None:
    class Hello(SseFilter):
        def start(self) -> bytes:
            return b": hello\n\n"

    sse, sent = Hello(watch()), Sent()
    async with upstream_response(sse_answer([WORDS[0]])) as response:
        await relay_events(response, sent, sse, 0, [])
    assert sent.bodies[0] == b": hello\n\n" and sent.messages[1].get("more_body") is True
    assert sent.body == b": hello\n\n" + WORDS[0] and sse.result.client_bytes == len(sent.body)


async def test_silence_becomes_keepalive_comments() -> None:
    sent = Sent()
    answer = [chunked_head(True) + frames(WORDS[0]), 0.15, frames(WORDS[1]) + END]
    async with upstream_response(*answer) as response:
        await relay_events(response, sent, SseFilter(watch()), 0.04, [])
    assert sent.body.startswith(WORDS[0] + SILENCE) and sent.body.endswith(SILENCE + WORDS[1])
    assert 2 <= sent.body.count(SILENCE) <= 4


async def test_a_broken_upstream_ends_with_one_error_event() -> None:
    sse, sent = SseFilter(watch()), Sent()
    async with upstream_response(sse_answer(STREAM[:3], end=False), "close") as response:
        await relay_events(response, sent, sse, 0, [])
    assert sent.body.startswith(b"".join(STREAM[:3])) and sent.finished
    assert error_event(sent.body)["code"] == "upstream_stream_broken"
    assert sse.result.stream_error == "stream_broken" and sse.result.client_bytes == len(sent.body)


async def test_a_silent_upstream_times_out() -> None:
    sse, sent = SseFilter(watch()), Sent()
    async with upstream_response(sse_answer(STREAM[:2], end=False), idle_s=0.1) as response:
        await relay_events(response, sent, sse, 0, [])
    assert error_event(sent.body)["code"] == "upstream_timeout"
    assert sse.result.stream_error == "timeout"


async def test_a_malformed_answer_mid_stream() -> None:
    sse, sent = SseFilter(watch()), Sent()
    async with upstream_response(sse_answer(STREAM[:2], end=False), 0.01, b"zz\r\nnot a chunk\r\n") as response:
        await relay_events(response, sent, sse, 0, [])
    assert sent.body.startswith(b"".join(STREAM[:2]))
    assert error_event(sent.body)["code"] == MALFORMED and sse.result.stream_error == "malformed"


async def test_a_filter_with_no_broken_event_still_ends_the_response() -> None:
    class Quiet(SseFilter):
        def broken(self, status: int, message: str, code: str) -> bytes:
            return b""

    sse, sent = Quiet(watch()), Sent()
    async with upstream_response(sse_answer(WORDS[:1], end=False), "close") as response:
        await relay_events(response, sent, sse, 0, [])
    assert sent.body == WORDS[0] and sent.finished and sse.result.stream_error == "stream_broken"


async def test_what_follows_the_last_whole_event_goes_to_end() -> None:
    seen: list[bytes] = []

    class Tail(SseFilter):
        def end(self, rest: bytes) -> bytes:
            seen.append(rest)
            return b"<" + rest + b">"

    sent = Sent()
    async with upstream_response(sse_answer([WORDS[0], b'data: {"cut'])) as response:
        await relay_events(response, sent, Tail(watch()), 0, [])
    assert seen == [b'data: {"cut'] and sent.bodies[-1] == b'<data: {"cut>'


async def test_relay_sse_is_chats_relay() -> None:
    result, sent = Result(), Sent()
    async with upstream_response(sse_answer(STREAM)) as response:
        await relay_sse(response, sent, StreamWatch(result, True, lambda: None), 0, [(b"x", b"y")])
    assert sent.body == b"".join(e for e in STREAM if e != USAGE_ONLY) and result.usage == USAGE
    assert (b"x", b"y") in sent.headers


async def test_a_client_that_leaves_stops_the_relay_at_once() -> None:
    sent = Sent()
    async with upstream_response(chunked_head(True) + frames(WORDS[0])) as response:
        task = asyncio.ensure_future(relay_events(response, sent, SseFilter(watch()), 0, []))
        while sent.body != WORDS[0]:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not sent.finished, "nothing more is sent to a client that left"


# ---- the callback relay, on a lent connection ----


class LentClient:
    """The client's connection as the server lends it (``ClientOut``): a real loopback transport."""

    def __init__(self, transport: asyncio.Transport, paused: bool = False) -> None:
        self.transport = transport
        self.paused = paused
        self.on_writable: Callable[[bool], None] | None = None

    def direct_transport(self) -> asyncio.Transport:
        return self.transport

    def writing_paused(self) -> bool:
        return self.paused


def dechunk(raw: bytes) -> bytes | None:
    """The data of the chunk frames in ``raw``; None while a frame is incomplete (or not one)."""
    out, pos = [], 0
    while pos < len(raw):
        i = raw.find(b"\r\n", pos)
        if i < 0:
            return None
        size = int(raw[pos:i], 16)
        if raw[i + 2 + size : i + 4 + size] != b"\r\n":
            return None
        out.append(raw[i + 2 : i + 2 + size])
        pos = i + 4 + size
    return b"".join(out)


async def read_frames(reader: asyncio.StreamReader, expected: bytes) -> None:
    """Read the client's end of the connection until its chunk frames carry ``expected`` (2 s at most)."""
    framed = b""
    async with asyncio.timeout(2):
        while dechunk(framed) != expected:
            framed += await reader.read(65536)


@contextlib.asynccontextmanager
async def lent_client(paused: bool = False) -> AsyncIterator[tuple[LentClient, asyncio.StreamReader]]:
    """A loopback connection: the relay writes to one end, the test reads the other."""
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        asyncio.get_running_loop().create_future()
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result((reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    reader, other_end = await accepted
    try:
        yield LentClient(writer.transport, paused), reader  # type: ignore[arg-type]
    finally:
        writer.close()
        other_end.close()
        server.close()


async def test_on_a_lent_connection_chunks_go_straight_to_the_client() -> None:
    sse, sent = SseFilter(watch()), Sent()
    expected = b"".join(e for e in STREAM if e != USAGE_ONLY)
    async with lent_client() as (client, reader):
        answer = [chunked_head(True), *(x for e in STREAM for x in (frames(e), 0.002)), END]
        async with upstream_response(*answer) as response:
            await relay_events(response, sent, sse, 0, [], client)
            assert response.sink is None and response.direct is None and client.on_writable is None
        await read_frames(reader, expected)
    assert sent.status == 200 and sent.body == b"" and sent.finished, "only the head and the end through ASGI"
    assert sse.result.usage == USAGE and sse.result.client_bytes == len(expected)


async def test_a_paused_client_holds_the_upstream_until_it_drains() -> None:
    sse, sent = SseFilter(watch()), Sent()
    async with lent_client(paused=True) as (client, reader):
        answer = [chunked_head(True) + frames(WORDS[0]), 0.02, frames(WORDS[1]) + frames(WORDS[2]) + END]
        async with upstream_response(*answer) as response:
            task = asyncio.ensure_future(relay_events(response, sent, sse, 0, [], client))
            await asyncio.sleep(0.1)
            assert response.held and response.paused, "upstream reading pauses while the client cannot take more"
            assert not task.done() and client.on_writable is not None
            client.on_writable(True)  # the client's transport drained
            await asyncio.wait_for(task, 2)
            assert not response.held
        await read_frames(reader, b"".join(WORDS))
    assert sse.result.client_bytes == len(b"".join(WORDS)) and sent.finished
