"""A synthetic SGLang-like streaming upstream for relay benchmarks (one process, uvloop, raw protocol).

    python -m loadtest.bench.relay_upstream --port P [--interval 0.1]

``POST /v1/chat/completions`` with ``"stream": true`` answers ``max_tokens`` content chunks, one every
``--interval`` seconds, shaped like SGLang's (then the finish chunk, the usage chunk when
``stream_options.include_usage`` asks for it, and ``[DONE]``), chunked transfer encoding, keep-alive.
Each content chunk carries its send time (``CLOCK_MONOTONIC``, shared by processes on one machine)
as its text, ``"content":"t<seconds> "``, so the client measures transit through whatever sits
in between. Non-streamed requests get a small JSON answer at once. One timer wheel drives every
stream (``Wheel``: slots of ``TICK`` seconds, one loop timer per slot, not one per chunk), so that
20,000 chunks/s cost this process little more than its socket writes.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson

MODEL = "bench-model"
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
_PREFIX = b'data: {"id":"%s","object":"chat.completion.chunk","created":1,"model":"' + MODEL.encode() + b'","choices":['
_CHOICE = (
    b'{"index":0,"delta":{"role":null,"content":"%s","reasoning_content":null,"tool_calls":null},'
    b'"logprobs":null,"finish_reason":%s,"matched_stop":null}],"usage":null}\n\n'
)
_USAGE = (
    b'],"usage":{"prompt_tokens":50,"total_tokens":%d,"completion_tokens":%d,'
    b'"prompt_tokens_details":null,"reasoning_tokens":0}}\n\n'
)
_JSON = orjson.dumps(
    {
        "id": "b",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51},
    }
)
_INFO = {
    b"/get_server_info": orjson.dumps({"max_total_num_tokens": 1_000_000_000, "dp_size": 1}),
    b"/v1/models": orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}),
    b"/v1/loads": orjson.dumps(
        {
            "loads": [
                {
                    "dp_rank": 0,
                    "num_running_reqs": 0,
                    "num_waiting_reqs": 0,
                    "token_usage": 0.0,
                    "max_total_num_tokens": 1_000_000_000,
                }
            ]
        }
    ),
    b"/health": b"",
    b"/health_generate": b"",
    b"/get_model_info": orjson.dumps({"model_path": MODEL}),
}


def _max_tokens(req: dict[str, object]) -> int:
    """sglang-router forwards ``max_tokens`` as ``max_completion_tokens``: read either (without
    this, streams through the router stopped at the default 16 chunks, not the benchmark's 50)."""
    value = req.get("max_tokens") or req.get("max_completion_tokens") or 16
    return int(value) if isinstance(value, int | str) else 16


def _framed(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


TICK = 0.002
"""The wheel's slot: a chunk goes out within this of its due time (its timestamp is taken as it
goes, so the lateness is not counted as transit)."""


class Wheel:
    """Calls each scheduled ``_tick`` in the slot of its due time; one ``call_at`` per busy slot."""

    def __init__(self) -> None:
        self.slots: dict[int, list[UpstreamProtocol]] = {}
        self.loop = asyncio.get_running_loop()

    def after(self, delay: float, conn: UpstreamProtocol) -> None:
        slot = int((self.loop.time() + delay) / TICK) + 1
        due = self.slots.get(slot)
        if due is None:
            due = self.slots[slot] = []
            self.loop.call_at(slot * TICK, self._run, slot)
        due.append(conn)

    def _run(self, slot: int) -> None:
        for conn in self.slots.pop(slot, ()):
            conn._tick()


_wheel: Wheel | None = None


def wheel() -> Wheel:
    global _wheel
    if _wheel is None:
        _wheel = Wheel()
    return _wheel


class _Stream:
    __slots__ = ("conn", "left", "rid", "sent", "usage")

    def __init__(self, conn: UpstreamProtocol, rid: bytes, tokens: int, usage: bool) -> None:
        self.conn, self.rid, self.left, self.sent, self.usage = conn, rid, tokens, 0, usage


class UpstreamProtocol(asyncio.Protocol):
    interval = 0.1

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.stream: _Stream | None = None
        self.count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.stream is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            i = head.find(b"content-length:")
            length = 0
            if i >= 0:
                j = head.find(b"\r\n", i)
                length = int(head[i + 15 : j if j > 0 else len(head)])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self._respond(head.split(b" ", 2), body)

    def _respond(self, line: list[bytes], body: bytes) -> None:
        assert self.transport is not None
        path = line[1]
        if path in _INFO:
            payload = _INFO[path]
        elif path.endswith(b"/completions") and line[0] == b"post":
            req = orjson.loads(body)
            if req.get("stream"):
                self.count += 1
                usage = bool((req.get("stream_options") or {}).get("include_usage"))
                self.stream = _Stream(self, b"%d-%d" % (id(self), self.count), _max_tokens(req), usage)
                self.transport.write(_HEAD + _framed(_PREFIX % self.stream.rid + _CHOICE % (b"", b"null")))
                wheel().after(self.interval, self)
                return
            payload = _JSON
        else:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )

    def _tick(self) -> None:
        stream = self.stream
        if stream is None or self.transport is None or self.transport.is_closing():
            self.stream = None
            return
        stream.sent += 1
        text = b"t%.6f " % time.monotonic()
        if stream.sent < stream.left:
            self.transport.write(_framed(_PREFIX % stream.rid + _CHOICE % (text, b"null")))
            wheel().after(self.interval, self)
            return
        out = _framed(_PREFIX % stream.rid + _CHOICE % (text, b'"stop"'))
        if stream.usage:
            out += _framed(_PREFIX % stream.rid + _USAGE % (50 + stream.sent, stream.sent))
        self.transport.write(out + _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.stream = None
        if self.buf:
            self.data_received(b"")


async def serve(host: str, port: int, interval: float) -> None:
    UpstreamProtocol.interval = interval
    server = await asyncio.get_running_loop().create_server(UpstreamProtocol, host, port, backlog=8192)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between chunks of one stream")
    args = parser.parse_args()
    import uvloop

    uvloop.run(serve(args.host, args.port, args.interval))


if __name__ == "__main__":
    main()
