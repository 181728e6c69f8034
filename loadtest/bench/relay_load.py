"""The load generator of the relay benchmark: its own process, uvloop, raw protocols (no HTTP library).

    python -m loadtest.bench.relay_load streams --port P --streams N --tokens K [--ramp S] [--procs 2]
    python -m loadtest.bench.relay_load short --port P --connections C --seconds T [--rate R]

``streams`` opens N concurrent streamed chat requests (spread over ``--ramp`` seconds) and reads
each to ``[DONE]``; every content chunk of the synthetic upstream (loadtest/bench/relay_upstream.py)
carries its send time, so the transit through the server in between is measured per chunk.
``short`` keeps C keep-alive connections busy with non-streamed requests for T seconds (at R requests/s
in all, or each as fast as it is answered).
``--procs``: the streams are split over that many processes (the load generator must not be what
saturates: at 2,000 streams × 10 chunks/s one process was busy most of the time).
Prints one JSON object: completed, errors by kind, chunks, transit p50/p99 (ms), requests.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter

import orjson

MARK = b'"content":"t'


def _request(port: int, stream: bool, tokens: int) -> bytes:
    body = orjson.dumps(
        {
            "model": "bench-model",
            "stream": stream,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Write the next line of the program."}],
        }
    )
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (port, len(body), body)
    )


class Stats:
    def __init__(self) -> None:
        self.completed = 0
        self.errors: Counter[str] = Counter()
        self.chunks = 0
        self.transit: list[float] = []


class StreamClient(asyncio.Protocol):
    def __init__(self, request: bytes, stats: Stats, done: asyncio.Future[None]) -> None:
        self.request, self.stats, self.done = request, stats, done
        self.status: int | None = None
        self.head = b""
        self.rest = b""
        self.finished = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.status is None or self.status != 200:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = int(self.head[9:12])
            if self.status != 200:  # read the error body for its code: status_503_overloaded
                i = self.head.find(b'"code":"')
                if i < 0 and not self.head.endswith(b"}"):
                    return
                code = self.head[i + 8 : self.head.find(b'"', i + 8)].decode() if i >= 0 else ""
                self._finish(f"status_{self.status}" + (f"_{code}" if code else ""))
                return
            data, self.head = self.head[end + 4 :], b""
        buf = self.rest + data
        last = 0
        while True:
            i = buf.find(MARK, last)
            if i < 0:
                break
            j = buf.find(b" ", i + 12)
            if j < 0:
                break
            self.stats.transit.append(now - float(buf[i + 12 : j]))
            self.stats.chunks += 1
            last = j
        if b'"error"' in buf:
            self._finish("error_event")
        elif b"data: [DONE]" in buf and buf.endswith(b"0\r\n\r\n"):
            self._finish(None)
        else:
            self.rest = buf[max(last, len(buf) - 64) :]

    def _finish(self, error: str | None) -> None:
        if self.finished:
            return
        self.finished = True
        if error is None:
            self.stats.completed += 1
        else:
            self.stats.errors[error] += 1
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish("closed" if self.status is not None else "closed_before_headers")


async def run_streams(port: int, streams: int, tokens: int, ramp: float, timeout: float) -> Stats:
    loop = asyncio.get_running_loop()
    stats = Stats()
    request = _request(port, True, tokens)
    futures: list[asyncio.Future[None]] = []

    async def one() -> None:
        done: asyncio.Future[None] = loop.create_future()
        futures.append(done)
        try:
            await loop.create_connection(lambda: StreamClient(request, stats, done), "127.0.0.1", port)
        except OSError as exc:
            stats.errors[f"connect_{type(exc).__name__}"] += 1
            done.set_result(None)

    started = time.monotonic()
    tasks = []
    for i in range(streams):
        tasks.append(asyncio.ensure_future(one()))
        due = started + ramp * (i + 1) / streams
        if due > time.monotonic() + 0.002:
            await asyncio.sleep(due - time.monotonic())
    await asyncio.gather(*tasks)
    pending = [f for f in futures if not f.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=max(1.0, timeout - (time.monotonic() - started)))
        if late:
            stats.errors["timeout"] += len(late)
    return stats


class ShortClient(asyncio.Protocol):
    def __init__(
        self, request: bytes, stats: Stats, deadline: float, done: asyncio.Future[None], period: float
    ) -> None:
        self.request, self.stats, self.deadline, self.done = request, stats, deadline, done
        self.period = period
        self.due = time.monotonic()
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            i = head.find(b"content-length:")
            if i < 0:
                self.stats.errors["no_length"] += 1
                self._stop()
                return
            j = head.find(b"\r\n", i)
            length = int(head[i + 15 : j if j > 0 else len(head)])
            if len(self.buf) < end + 4 + length:
                return
            status = int(head[9:12])
            self.buf = self.buf[end + 4 + length :]
            if status == 200:
                self.stats.completed += 1
            else:
                self.stats.errors[f"status_{status}"] += 1
            if time.monotonic() >= self.deadline:
                self._stop()
                return
            self._next()

    def _next(self) -> None:
        # Paced (``--rate``): each connection sends its share on a fixed schedule, late ones at once.
        self.due += self.period
        delay = self.due - time.monotonic()
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, self._send)
        else:
            self._send()

    def _send(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.request)

    def _stop(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if time.monotonic() < self.deadline:
                self.stats.errors["closed"] += 1
            self.done.set_result(None)


async def run_short(port: int, connections: int, seconds: float, rate: float) -> Stats:
    loop = asyncio.get_running_loop()
    stats = Stats()
    request = _request(port, False, 1)
    deadline = time.monotonic() + seconds
    futures = []
    period = connections / rate if rate else 0.0
    for _ in range(connections):
        done: asyncio.Future[None] = loop.create_future()
        futures.append(done)
        await loop.create_connection(lambda d=done: ShortClient(request, stats, deadline, d, period), "127.0.0.1", port)
    await asyncio.wait(futures, timeout=seconds + 30)
    return stats


def _streams_part(args: tuple[int, int, int, float, float]) -> Stats:
    import uvloop

    return uvloop.run(run_streams(*args))


def run_streams_split(port: int, streams: int, tokens: int, ramp: float, timeout: float, procs: int) -> Stats:
    """``run_streams`` over ``procs`` processes (each its share, over the same ramp), merged."""
    if procs <= 1 or streams < procs:
        return _streams_part((port, streams, tokens, ramp, timeout))
    import multiprocessing

    shares = [streams // procs + (1 if i < streams % procs else 0) for i in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_streams_part, [(port, n, tokens, ramp, timeout) for n in shares])
    stats = Stats()
    for part in parts:
        stats.completed += part.completed
        stats.errors.update(part.errors)
        stats.chunks += part.chunks
        stats.transit += part.transit
    return stats


def _q(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["streams", "short"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--ramp", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=0.0, help="short: requests/s in all (0: as fast as answered)")
    parser.add_argument("--procs", type=int, default=2, help="streams: processes to split the streams over")
    args = parser.parse_args()
    import uvloop

    t0 = time.monotonic()
    if args.mode == "streams":
        stats = run_streams_split(args.port, args.streams, args.tokens, args.ramp, args.timeout, args.procs)
    else:
        stats = uvloop.run(run_short(args.port, args.connections, args.seconds, args.rate))
    stats.transit.sort()
    out = {
        "completed": stats.completed,
        "errors": dict(stats.errors),
        "chunks": stats.chunks,
        "transit_p50_ms": _q(stats.transit, 0.5),
        "transit_p99_ms": _q(stats.transit, 0.99),
        "wall_s": round(time.monotonic() - t0, 2),
    }
    sys.stdout.write(orjson.dumps(out).decode() + "\n")


if __name__ == "__main__":
    main()
