"""A small scripted SGLang-like upstream for proxy tests that need exact bytes or exact timing.

A raw asyncio HTTP/1.1 server (not a framework) so the tests can see, per TCP connection, when
the gateway opened and closed it. Integration tests use the simulated SGLang server instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

SERVED = "served/kimi"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    choices: bool = True,
) -> bytes:
    body: dict[str, Any] = {
        "id": "req-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": SERVED,
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish, "matched_stop": None}]
        if choices
        else [],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18, "prompt_tokens_details": {"cached_tokens": 5}}


def script_events(kind: str, include_usage: bool) -> list[bytes]:
    """The SSE events the fake sends for a scripted stream."""
    events = [chunk({"role": "assistant", "content": ""})]
    if kind == "reasoning":
        events += [chunk({"reasoning_content": "Let me think"}), chunk({"reasoning_content": " about it."})]
        events += [chunk({"content": "Answer: "}), chunk({"content": "42"})]
        events.append(chunk({}, finish="stop"))
    elif kind == "tools":
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "functions.read_file:0",
                            "type": "function",
                            "function": {"name": "read_file", "arguments": ""},
                        }
                    ]
                }
            )
        )
        events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": "a.py"}'}}]}))
        events.append(chunk({}, finish="tool_calls"))
    else:
        events += [chunk({"content": w}) for w in ("Hello", ", ", "world", "!")]
        events.append(chunk({}, finish="stop"))
    if include_usage:
        events.append(chunk(usage=USAGE, choices=False))
    events.append(b"data: [DONE]\n\n")
    return events


@dataclass
class Connection:
    opened: float
    closed: float | None = None
    requests: int = 0
    streaming: bool = False


@dataclass
class FakeUpstream:
    port: int = 0
    healthy: bool = True
    chunk_delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)
    """The exact SSE bytes of the last stream the fake sent."""
    error_status: int | None = None
    kv_tokens: int = 100_000
    flooded: int = 0
    """Bytes sent so far by a ``flood`` stream (a prompt with "flood": events as fast as the peer reads)."""
    _reader: Any = None
    _thread: threading.Thread | None = None
    _writers: list[asyncio.StreamWriter] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(time.monotonic())
        self.connections.append(conn)
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                conn.requests += 1
                self._reader = reader
                await self._respond(method, path, headers, body, writer, conn)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            conn.closed = time.monotonic()
            with contextlib.suppress(Exception):
                writer.close()

    async def _respond(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
        conn: Connection,
    ) -> None:
        if path == "/health":
            await _send_json(writer, 200 if self.healthy else 503, None)
        elif path == "/get_server_info":
            await _send_json(writer, 200, {"max_total_num_tokens": self.kv_tokens, "dp_size": 1, "version": "0.5.23"})
        elif path == "/v1/models":
            await _send_json(writer, 200, {"object": "list", "data": [{"id": SERVED, "object": "model"}]})
        elif path == "/v1/loads":
            await _send_json(
                writer,
                200,
                {
                    "loads": [
                        {
                            "dp_rank": 0,
                            "num_running_reqs": 0,
                            "num_waiting_reqs": 0,
                            "token_usage": 0.1,
                            "max_total_num_tokens": self.kv_tokens,
                        }
                    ]
                },
            )
        elif path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            payload = orjson.loads(body)
            self.requests.append({"path": path, "headers": headers, "body": payload})
            conn.streaming = True
            try:
                await self._complete(payload, writer)
            finally:
                conn.streaming = False
        else:
            await _send_json(writer, 404, {"detail": "Not Found"})

    async def _complete(self, payload: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        if self.error_status is not None:
            await _send_json(
                writer,
                self.error_status,
                {
                    "object": "error",
                    "message": "scripted failure",
                    "type": "BadRequestError",
                    "param": None,
                    "code": self.error_status,
                },
            )
            return
        last = payload.get("messages", [{}])[-1].get("content") or payload.get("prompt") or ""
        if "stall" in last:
            # Watch the socket while stalling, so a peer that leaves is seen at once.
            with contextlib.suppress(asyncio.TimeoutError):
                if await asyncio.wait_for(self._reader.read(1), 3.0) == b"":
                    raise ConnectionError("peer closed")
        kind = "reasoning" if "think" in last else "tools" if "tool" in last else "plain"
        if not payload.get("stream"):
            message: dict[str, Any] = {"role": "assistant", "content": "Hello, world!"}
            if kind == "reasoning":
                message["reasoning_content"] = "Let me think about it."
            await _send_json(
                writer,
                200,
                {
                    "id": "req-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": SERVED,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": USAGE,
                },
            )
            return
        if "flood" in last:
            await self._flood(writer)
            return
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        events = script_events(kind, include_usage)
        if "slow" in last:
            events = events[:1] + [chunk({"content": f"tok{i} "}) for i in range(400)] + events[1:]
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.sent = []
        for event in events:
            self.sent.append(event)
            # Split events across writes to check the gateway reassembles them.
            for part in (event[: len(event) // 2], event[len(event) // 2 :]):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            if self.chunk_delay_s or "slow" in last:
                await asyncio.sleep(self.chunk_delay_s or 0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _flood(self, writer: asyncio.StreamWriter) -> None:
        """Content events without end, each sent as soon as the gateway takes the last (``drain``)."""
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        event = chunk({"content": "x" * 8000})
        frame = b"%x\r\n%s\r\n" % (len(event), event)
        self.flooded = 0
        while True:
            writer.write(frame)
            await writer.drain()
            self.flooded += len(frame)

    @contextlib.contextmanager
    def running(self) -> Iterator[FakeUpstream]:
        self.port = self.port or free_port()
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
            ready.set()
            loop.run_forever()
            self._server.close()
            for writer in self._writers:  # a stopped server drops its keep-alive connections too
                writer.close()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=2))
            loop.close()

        thread = threading.Thread(target=main, daemon=True)
        self._thread = thread
        thread.start()
        ready.wait(5)
        try:
            yield self
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop listening and drop every connection (as a killed server would)."""
        if self._thread is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._thread = None


async def _send_json(writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
    body = b"" if payload is None else orjson.dumps(payload)
    writer.write(
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body)
    )
    await writer.drain()
