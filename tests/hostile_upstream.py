"""A hostile SGLang-like upstream: a raw socket server that answers chat completions with malformed
HTTP/1.1 on request (issue #35's list), and valid answers otherwise.

A chat request whose last message is ``case:NAME`` gets the scenario ``NAME`` (``CASES``); any other
gets a valid answer whose content is the message itself (streamed as SSE in chunked frames, or as
JSON with a ``Content-Length``), so a test can check that each request got exactly its own bytes.
The pool's routes (``/health``, ``/get_server_info``, ``/v1/models``, ``/v1/loads``) answer validly.

tests/hostile_client.py sends the scenarios through a gateway and says what the client got.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tests.fake_upstream import free_port

SERVED = "served/kimi"
Step = bytes | float | str
"""Bytes to write, seconds to sleep, or an action: ``"close"``, ``"reset"``, ``"hold"`` (keep the
connection open, reading nothing more, until the peer leaves)."""


def event(content: str, finish: str | None = None) -> bytes:
    body = {
        "id": "req-h",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": SERVED,
        "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def stream_body(content: str) -> bytes:
    """The SSE events of a valid streamed answer carrying ``content``."""
    return event(content) + event("", "stop") + b"data: [DONE]\n\n"


def json_body(content: str) -> bytes:
    return orjson.dumps(
        {
            "id": "req-h",
            "object": "chat.completion",
            "created": 1,
            "model": SERVED,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    )


def body_of(stream: bool, content: str) -> bytes:
    return stream_body(content) if stream else json_body(content)


def _ctype(stream: bool) -> bytes:
    return b"content-type: " + (b"text/event-stream" if stream else b"application/json") + b"\r\n"


def chunked_head(stream: bool) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + _ctype(stream) + b"transfer-encoding: chunked\r\n\r\n"


def frames(data: bytes, ext: bytes = b"") -> bytes:
    """``data`` as chunk frames of at most 64 bytes (with chunk extension ``ext``)."""
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in (data[i : i + 64] for i in range(0, len(data), 64)))


def valid(stream: bool, content: str) -> list[Step]:
    """A valid answer: chunked SSE for a stream, ``Content-Length`` JSON otherwise."""
    body = body_of(stream, content)
    if stream:
        return [chunked_head(True) + frames(body) + b"0\r\n\r\n"]
    return [b"HTTP/1.1 200 OK\r\n" + _ctype(False) + b"content-length: %d\r\n\r\n%s" % (len(body), body)]


def _length_head(stream: bool, length: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + _ctype(stream) + b"content-length: %d\r\n\r\n" % length


@dataclass(frozen=True)
class Case:
    """A malformation: ``steps(stream, content)`` is what the upstream sends; ``ok`` says whether the
    client must get exactly the valid answer (else a clean error)."""

    steps: Callable[[bool, str], list[Step]]
    ok: bool


def _cases() -> dict[str, Case]:
    b = body_of
    return {
        "negative_chunk_size": Case(lambda s, c: [chunked_head(s) + b"-6\r\n" + b(s, c)[:6] + b"\r\n", "hold"], False),
        "huge_chunk_size": Case(lambda s, c: [chunked_head(s) + b"ffffffffffffffff\r\n" + b(s, c), "hold"], False),
        "non_hex_chunk_size": Case(lambda s, c: [chunked_head(s) + b"zz\r\n" + b(s, c) + b"\r\n", "hold"], False),
        "chunk_extensions": Case(lambda s, c: [chunked_head(s) + frames(b(s, c), b";name=value") + b"0\r\n\r\n"], True),
        "trailers_one_packet": Case(
            lambda s, c: [chunked_head(s) + frames(b(s, c)) + b"0\r\nx-trailer: 1\r\n\r\n"], True
        ),
        "trailers_split": Case(
            lambda s, c: [chunked_head(s) + frames(b(s, c)) + b"0\r\nx-trailer: 1\r\n", 0.05, b"\r\n"], True
        ),
        "conflicting_content_lengths": Case(
            lambda s, c: [
                b"HTTP/1.1 200 OK\r\n"
                + _ctype(s)
                + b"content-length: %d\r\ncontent-length: %d\r\n\r\n%s" % (len(b(s, c)), len(b(s, c)) // 2, b(s, c)),
                "hold",
            ],
            False,
        ),
        "transfer_encoding_and_length": Case(
            lambda s, c: [
                b"HTTP/1.1 200 OK\r\n"
                + _ctype(s)
                + b"transfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n"
                + frames(b(s, c))
                + b"0\r\n\r\n",
                "hold",
            ],
            False,
        ),
        "continue_then_response": Case(lambda s, c: [b"HTTP/1.1 100 Continue\r\n\r\n", 0.05, *valid(s, c)], True),
        "continue_kept_open": Case(lambda s, c: [b"HTTP/1.1 100 Continue\r\n\r\n", "hold"], False),
        "continue_then_closed": Case(lambda s, c: [b"HTTP/1.1 100 Continue\r\n\r\n", 0.05, "close"], False),
        "garbage_status_line": Case(lambda s, c: [b"SPAM EGGS\r\nx: y\r\n\r\n" + b(s, c), "hold"], False),
        "megabyte_header": Case(
            lambda s, c: [b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (1 << 20) + b"\r\n" + _length_head(s, 0)[17:], "hold"],
            False,
        ),
        "bytes_after_response": Case(
            lambda s, c: [
                _length_head(s, len(b(s, c))) + b(s, c) + b"STRAY BYTES",
                0.1,
                *valid(s, "a stray answer for nobody"),
            ],
            True,
        ),
        "body_cut_by_reset": Case(lambda s, c: [_length_head(s, 4096) + b(s, c)[:20], 0.05, "reset"], False),
        "chunk_without_crlf": Case(
            lambda s, c: [chunked_head(s) + b"%x\r\n%sXX" % (len(b(s, c)), b(s, c)) + b"0\r\n\r\n", "hold"], False
        ),
        "malformed_mid_stream": Case(
            lambda s, c: [chunked_head(s) + frames(b(s, c)[:40]), 0.05, b"-6\r\n" + b(s, c)[40:] + b"\r\n", "hold"],
            False,
        ),
        "close_delimited_body": Case(
            lambda s, c: [b"HTTP/1.1 200 OK\r\n" + _ctype(s) + b"connection: close\r\n\r\n" + b(s, c), "close"], True
        ),
    }


CASES = _cases()


def _answer(status: int, payload: Any) -> bytes:
    body = orjson.dumps(payload)
    return b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


_POOL_ROUTES = {
    "/health": _answer(200, {}),
    "/get_server_info": _answer(200, {"max_total_num_tokens": 100_000, "dp_size": 1, "version": "0.5.23"}),
    "/v1/models": _answer(200, {"object": "list", "data": [{"id": SERVED, "object": "model"}]}),
    "/v1/loads": _answer(
        200,
        {
            "loads": [
                {
                    "dp_rank": 0,
                    "num_running_reqs": 0,
                    "num_waiting_reqs": 0,
                    "token_usage": 0.0,
                    "max_total_num_tokens": 100_000,
                }
            ]
        },
    ),
}


@dataclass
class HostileUpstream:
    """The server (module docstring), on a thread of its own; ``sent`` maps a content to the valid
    body the upstream sent for it."""

    port: int = 0
    open_connections: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.open_connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET" and path in _POOL_ROUTES:
                    writer.write(_POOL_ROUTES[path])
                    await writer.drain()
                    continue
                payload = orjson.loads(body) if body else {}
                content = str((payload.get("messages") or [{}])[-1].get("content") or "")
                stream = bool(payload.get("stream"))
                case = CASES.get(content.removeprefix("case:")) if content.startswith("case:") else None
                steps = case.steps(stream, content) if case else valid(stream, content)
                if not await self._play(steps, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, ValueError):
            pass
        finally:
            self.open_connections -= 1
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _play(self, steps: list[Step], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Send ``steps``; False when the connection is done with."""
        for step in steps:
            if isinstance(step, bytes):
                writer.write(step)
                await writer.drain()
            elif isinstance(step, float):
                await asyncio.sleep(step)
            elif step == "close":
                return False
            elif step == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return False
            elif step == "hold":
                with contextlib.suppress(ConnectionError):
                    while await reader.read(65536):
                        pass
                return False
        return True

    @contextlib.contextmanager
    def running(self) -> Iterator[HostileUpstream]:
        self.port = self.port or free_port()
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
            ready.set()
            loop.run_forever()
            server.close()
            for writer in list(self._writers):
                writer.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=2))
            loop.close()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        ready.wait(5)
        try:
            yield self
        finally:
            if self._loop is not None and self._thread is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(5)
