"""Scripted upstreams for the relay and surface tests: an upstream on the test's event loop plays
bytes, waits and closes as scripted (``scripted``), read by the lean client (``upstream_response``);
``Sent`` records what a relay sends the client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.types import Message

from gateway.http.wire import WireResponse
from gateway.http.wire_pool import WireClient
from gateway.relay.proxy import Result, StreamWatch
from tests.fake_upstream import USAGE, chunk
from tests.hostile_upstream import chunked_head

Step = bytes | float | str
"""Bytes to write, seconds to wait, or ``"close"`` (drop the connection); after the last step the
connection is held open until the client closes it."""

ROLE = chunk({"role": "assistant", "content": ""})
WORDS = [chunk({"content": w}) for w in ("Hello", ", ", "world")]
FINISH = chunk({}, finish="stop")
USAGE_ONLY = chunk(usage=USAGE, choices=False)
DONE = b"data: [DONE]\n\n"
STREAM = [ROLE, *WORDS, FINISH, USAGE_ONLY, DONE]
END = b"0\r\n\r\n"


def sse_answer(events: list[bytes], *, end: bool = True) -> bytes:
    """A chunked 200 event-stream answer carrying ``events`` (one frame per event)."""
    return chunked_head(True) + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + (END if end else b"")


@contextlib.asynccontextmanager
async def scripted(*steps: Step) -> AsyncIterator[str]:
    """An upstream on the running loop: each request is read whole, then ``steps`` are played."""
    writers: list[asyncio.StreamWriter] = []
    handlers: list[asyncio.Task[Any]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                ),
                0,
            )
            await reader.readexactly(length)
            for step in steps:
                if isinstance(step, bytes):
                    writer.write(step)
                    await writer.drain()
                elif isinstance(step, float):
                    await asyncio.sleep(step)
                elif step == "close":
                    break
            else:
                await reader.read()  # keep the connection until the client is done with it
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        for task in handlers:
            task.cancel()  # a step still waiting: the handler ends quietly
        if handlers:
            await asyncio.wait(handlers, timeout=1)


@contextlib.asynccontextmanager
async def upstream_response(*steps: Step, idle_s: float = 5.0) -> AsyncIterator[WireResponse]:
    """The lean client's response (head read) to a POST the ``scripted`` upstream answers with ``steps``."""
    async with scripted(*steps) as url:
        client = WireClient(1.0, idle_s, 5.0, 4)
        response = await client.post(url + "/v1/chat/completions", {"content-type": "application/json"}, b"{}")
        try:
            yield response
        finally:
            response.close()
            await client.aclose()


class Sent:
    """An ASGI ``send`` that keeps what it was given."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.messages[0]["headers"])

    @property
    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m["type"] == "http.response.body"]

    @property
    def body(self) -> bytes:
        return b"".join(self.bodies)

    @property
    def finished(self) -> bool:
        last = self.messages[-1]
        return last["type"] == "http.response.body" and not last.get("more_body", False)


def watch(strip: bool = True, on_first: Callable[[], None] | None = None) -> StreamWatch:
    return StreamWatch(Result(), strip, on_first or (lambda: None))


def error_event(raw: bytes) -> dict[str, Any]:
    """The error object of chat's in-stream error event in ``raw`` (followed by [DONE])."""
    assert raw.endswith(b"\n\n" + DONE)
    line = raw[: -len(DONE) - 2].rsplit(b"\n\n", 1)[-1]
    assert line.startswith(b"data: ")
    error: dict[str, Any] = orjson.loads(line[6:])["error"]
    return error
