"""Micro-benchmark of the relay's per-chunk path, no sockets: synthetic upstream bytes into the wire
protocol (``WireResponse.data_received``), through the callback relay (gateway/relay/events.py) and the
chat filter, to a client transport that only counts what it is given.

    python -m loadtest.bench.chunk [--chunks 200000] [--streams 1000] [--per-read 1] [--profile]

Prints the Python time per relayed chunk (user+system of this process over the timed part; the
syscalls a live relay pays per chunk, one read and one write, are not in it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import time
from typing import Any

from gateway.http.wire import WireResponse
from gateway.relay.events import SseFilter, relay_events
from gateway.relay.proxy import Result, StreamWatch

_PREFIX = b'data: {"id":"%d","object":"chat.completion.chunk","created":1,"model":"bench-model","choices":['
_CHOICE = (
    b'{"index":0,"delta":{"role":null,"content":"%s","reasoning_content":null,"tool_calls":null},'
    b'"logprobs":null,"finish_reason":%s,"matched_stop":null}],"usage":null}\n\n'
)


def _framed(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class _Pool:
    idle_s = 300.0

    def put_back(self, _: Any) -> None:
        pass

    def release(self) -> None:
        pass


class _Transport:
    def __init__(self) -> None:
        self.bytes = 0
        self.writes = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self.closing = True


class _Client:
    on_writable = None

    def __init__(self) -> None:
        self.transport = _Transport()

    def direct_transport(self) -> Any:
        return self.transport

    def writing_paused(self) -> bool:
        return False


async def _send(message: Any) -> None:
    pass


async def run(chunks: int, streams: int, per_read: int, profile: bool) -> None:
    pool = _Pool()
    responses, tasks, clients = [], [], []
    for i in range(streams):
        response = WireResponse(pool, ("http", "x", 1))  # type: ignore[arg-type]
        response.connection_made(_Transport())  # type: ignore[arg-type]
        response.data_received(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + _framed(_PREFIX % i + _CHOICE % (b"", b"null"))
        )
        watch = StreamWatch(Result(), True, lambda: None)
        client = _Client()
        tasks.append(asyncio.ensure_future(relay_events(response, _send, SseFilter(watch), 15.0, [], client)))
        responses.append(response)
        clients.append(client)
    await asyncio.sleep(0.01)
    # first token for every stream (the slow path, once), then the steady state
    for i, response in enumerate(responses):
        response.data_received(_framed(_PREFIX % i + _CHOICE % (b"t1.0 ", b"null")))
    frames = [
        b"".join(_framed(_PREFIX % i + _CHOICE % (b"t%.6f " % (k * 0.1), b"null")) for k in range(per_read))
        for i in range(streams)
    ]
    rounds = chunks // (streams * per_read)
    prof = cProfile.Profile() if profile else None
    t0, c0 = time.perf_counter(), os.times()
    if prof:
        prof.enable()
    for _ in range(rounds):
        for response, frame in zip(responses, frames, strict=True):
            response.data_received(frame)
    if prof:
        prof.disable()
    c1, t1 = os.times(), time.perf_counter()
    n = rounds * streams * per_read
    writes = sum(c.transport.writes for c in clients)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    print(f"{n} chunks, {writes} client writes: {cpu / n * 1e6:.2f} µs CPU a chunk ({(t1 - t0) / n * 1e6:.2f} µs wall)")
    for response in responses:
        response.data_received(b"0\r\n\r\n")
    await asyncio.gather(*tasks)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--per-read", type=int, default=1, help="chunk frames that arrive in one read")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    import uvloop

    uvloop.run(run(args.chunks, args.streams, args.per_read, args.profile))


if __name__ == "__main__":
    main()
