"""How the lean upstream client (gateway/http/wire.py) frames responses with llhttp, over real loopback
sockets: what ends a response, when a connection may be reused, and what is malformed.

tests/gateway/test_wire_hostile.py runs the same malformations end to end through a gateway.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http import wire
from gateway.http.wire import UpstreamMalformed, WireResponse
from tests.gateway.test_wire import client, read_request, server

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"


async def test_a_byte_on_an_idle_pooled_connection_closes_it() -> None:
    stray = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await stray.wait()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray")  # nobody asked
        await writer.drain()
        while await reader.read(1024):  # a request sent on this connection would be answered by the stray
            pass

    async def fresh(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await handler(reader, writer) if not accepted[1:] else await _answer_all(reader, writer)

    async with server(fresh) as (base, accepted):
        wc = client()
        first = await wc.post(base + "/x", {}, b"{}")
        assert await first.receive() == b"hi"
        first.close()
        assert sum(len(q) for q in wc.idle.values()) == 1, "pooled"
        stray.set()
        await asyncio.sleep(0.1)
        second = await wc.post(base + "/x", {}, b"{}")
        assert await second.receive() == b"own", "its own answer, not the stray one"
        second.close()
        assert len(accepted) == 2, "the idle connection that got bytes was closed, a new one opened"
        await wc.aclose()


async def _answer_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nown")
        await writer.drain()


async def test_bytes_after_a_complete_response_keep_its_connection_out_of_the_pool() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if accepted[1:]:
            await _answer_all(reader, writer)
            return
        await read_request(reader)
        writer.write(OK + b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nstray")
        await writer.drain()
        await _answer_all(reader, writer)

    async with server(handler) as (base, accepted):
        wc = client()
        first = await wc.post(base + "/x", {}, b"{}")
        assert await first.receive() == b"hi"
        assert await first.receive() == b""
        first.close()
        assert not any(wc.idle.values()), "not reused"
        second = await wc.post(base + "/x", {}, b"{}")
        assert await second.receive() == b"own"
        second.close()
        assert len(accepted) == 2
        await wc.aclose()


@pytest.mark.parametrize(
    "wire_bytes",
    [
        b"SPAM\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 1\r\n\r\nhi",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
    ],
    ids=["garbage", "two-lengths", "te-and-length", "upgrade"],
)
async def test_a_malformed_head_is_upstream_malformed_for_post_and_get(wire_bytes: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(wire_bytes)
            await writer.drain()

    async with server(handler) as (base, _):
        wc = client()
        with pytest.raises(UpstreamMalformed):
            await wc.send("GET", base + "/health", {}, b"")
        with pytest.raises(UpstreamMalformed):
            await wc.get(base + "/health", {}, 2.0)
        assert wc.open == 0, "the connections were closed and their slots freed"
        await wc.aclose()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"-6\r\nhello!\r\n0\r\n\r\n", "Invalid character in chunk size"),
        (b"zz\r\nhello\r\n", "Invalid character in chunk size"),
        (b"5\r\nhelloXX0\r\n\r\n", "Expected LF after chunk data"),
    ],
)
async def test_bad_chunk_framing_is_malformed_and_nothing_of_it_is_read(body: bytes, reason: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(body)
        await writer.drain()
        await reader.read()

    async with server(handler) as (base, _):
        wc = client()
        response = await wc.post(base + "/x", {}, b"{}")
        with pytest.raises(UpstreamMalformed, match=reason):
            await response.receive()
        response.close()
        assert wc.open == 0
        await wc.aclose()


async def test_interim_answers_are_skipped_and_a_huge_chunk_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "CHUNK_LIMIT", 10)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n")
        await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)  # (in the head's read, a malformed body fails the head itself)
        writer.write(b"ffffffffffffffff\r\n" + b"x" * 20)
        await writer.drain()
        await reader.read()

    async with server(handler) as (base, _):
        wc = client()
        response = await wc.post(base + "/x", {}, b"{}")
        assert response.status_code == 200 and "link" not in response.headers
        assert await response.receive() == b"abc"
        with pytest.raises(UpstreamMalformed, match="a chunk of more than 10 bytes"):
            await response.receive()
        response.close()
        await wc.aclose()


async def test_a_head_past_the_limit_is_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "HEAD_LIMIT", 1000)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(20):
            writer.write(b"x-filler: " + b"a" * 100 + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.001)
        await reader.read()

    async with server(handler) as (base, _):
        wc = client()
        with pytest.raises(UpstreamMalformed, match="a head over 1000 bytes"):
            await wc.post(base + "/x", {}, b"{}")
        await wc.aclose()


async def test_a_close_delimited_body_ends_at_the_close_and_a_reset_breaks_it() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        await writer.drain()

    async with server(handler) as (base, _):
        wc = client()
        response = await wc.post(base + "/x", {}, b"{}")
        body = b""
        while chunk := await response.receive():
            body += chunk
        assert body == b"until the end"
        response.close()
        await wc.aclose()


class _Client:
    idle_s = 5.0


def test_the_relay_gets_the_upstream_frame_only_when_a_read_is_exactly_one_frame() -> None:
    """A read may end a chunk begun in the last read and carry the next chunk's size line in a frame's
    length: the relay must frame that data itself, not forward the read as a frame."""
    loop = asyncio.new_event_loop()
    try:
        conn = WireResponse(_Client(), ("http", "x", 80), loop)  # type: ignore[arg-type]
        seen: list[tuple[bytes, bytes]] = []
        conn.direct = lambda frame, body: seen.append((frame, body)) is None
        conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n")
        conn.data_received(b"hello\r\n3\r\n")  # 10 bytes: as long as the frame "5\r\nhello\r\n"
        conn.data_received(b"abc\r\n")
        conn.data_received(b"4\r\nwxyz\r\n")  # a whole frame: forwarded as it came
        assert seen == [(b"", b"hello"), (b"", b"abc"), (b"4\r\nwxyz\r\n", b"wxyz")]
    finally:
        loop.close()


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=200),
    head=st.sampled_from(
        [
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 20\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
            b"",
        ]
    ),
    seed=st.integers(0, 1000),
)
def test_any_bytes_end_in_a_bounded_answer_or_an_error(data: bytes, head: bytes, seed: int) -> None:
    """Whatever an upstream sends, in any split: every read returns, and what is delivered is no more
    than what was sent (the negative-chunk freeze, or bytes read twice, would break one of these)."""
    loop = asyncio.new_event_loop()
    try:
        conn = WireResponse(_Client(), ("http", "x", 80), loop)  # type: ignore[arg-type]
        wire_bytes = head + data
        rng = random.Random(seed)
        pos = 0
        while pos < len(wire_bytes):
            step = rng.randint(1, 40)
            conn.data_received(wire_bytes[pos : pos + step])
            pos += step
        delivered = sum(len(part) for part in conn.out)
        assert delivered <= len(data)
        if conn.error is not None:
            assert isinstance(conn.error, httpx.RemoteProtocolError)
            assert not conn.reusable
    finally:
        loop.close()


_FRAMEISH = st.one_of(
    st.binary(min_size=1, max_size=40),
    st.binary(min_size=1, max_size=20).map(lambda b: b"%x\r\n%s\r\n" % (len(b), b)),  # data that looks framed
    st.just(b"data: {}\n\n"),
)


@settings(max_examples=400, deadline=None)
@given(
    chunks=st.lists(_FRAMEISH, min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 30), min_size=1, max_size=40),
    upper=st.booleans(),
)
def test_the_relays_shortcut_gives_exactly_what_llhttp_gives(chunks: list[bytes], cuts: list[int], upper: bool) -> None:
    """Reads that skip llhttp (one canonical frame at a chunk boundary, ``direct`` set) deliver the
    same bytes, in the same order, with the same end, as feeding every read to llhttp."""
    size = (lambda n: b"%X" % n) if upper else (lambda n: b"%x" % n)
    body = b"".join(size(len(c)) + b"\r\n" + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    wire_bytes = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body
    reads, pos, k = [], 0, 0
    while pos < len(wire_bytes):  # reads cut at the given sizes, and at every frame's end in turn
        step = cuts[k % len(cuts)]
        reads.append(wire_bytes[pos : pos + step])
        pos, k = pos + step, k + 1

    def run(shortcut: bool, pieces: list[bytes]) -> tuple[bytes, bool, bool]:
        loop = asyncio.new_event_loop()
        try:
            conn = WireResponse(_Client(), ("http", "x", 80), loop)  # type: ignore[arg-type]
            got: list[bytes] = []
            if shortcut:
                conn.direct = lambda frame, data: got.append(data) is None
            for piece in pieces:
                conn.data_received(piece)
                got += conn.out
                conn.out.clear()
            return b"".join(got), conn.done, conn.error is not None
        finally:
            loop.close()

    framed = [wire_bytes[: wire_bytes.index(b"\r\n\r\n") + 4]]
    framed += [size(len(c)) + b"\r\n" + c + b"\r\n" for c in chunks] + [b"0\r\n\r\n"]
    expected = (b"".join(chunks), True, False)
    for pieces in (reads, framed):
        assert run(False, pieces) == expected
        assert run(True, pieces) == expected


def test_a_size_line_cut_in_two_is_not_taken_for_a_frame() -> None:
    """A read ending in the first digit of a size line ("1" of "1a") leaves llhttp mid-line: the next
    read, though shaped like a whole 10-byte frame ("a\\r\\n...\\r\\n"), is the start of a 26-byte chunk."""
    data = b"0123456789\r\n" + b"z" * 14  # 26 bytes, the first 12 of them frame-shaped after "a\r\n"
    loop = asyncio.new_event_loop()
    try:
        conn = WireResponse(_Client(), ("http", "x", 80), loop)  # type: ignore[arg-type]
        got: list[bytes] = []
        conn.direct = lambda frame, body: got.append(body) is None
        conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n1")
        conn.data_received(b"a\r\n" + data[:12])
        conn.data_received(data[12:] + b"\r\n0\r\n\r\n")
        got += conn.out
        assert b"".join(got) == b"abcd" + data and conn.done and conn.error is None
    finally:
        loop.close()
