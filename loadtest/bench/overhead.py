"""Gateway overhead: a backend that answers at once, requests direct against through the gateway.

    python -m loadtest.bench.overhead [--requests 500] [--concurrency 16] [--seconds 10] [--policy gateway]

Prints added latency (p50, p99) for sequential non-streamed and streamed requests, and the
gateway's throughput under concurrent load as requests per second and per CPU-second of the
gateway process (read from /proc). The upstream is a minimal ASGI app in its own process that
answers every request at once with a fixed body, so what is measured is the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import orjson

MODEL = "bench-model"
_CHUNKS = [
    b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench-model","choices":[{"index":0,'
    b'"delta":{"content":"tok' + str(i).encode() + b' "},"finish_reason":null}],"usage":null}\n\n'
    for i in range(8)
]
_STREAM = b"".join(_CHUNKS) + (
    b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench-model",'
    b'"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":8,"total_tokens":58}}\n\n'
    b"data: [DONE]\n\n"
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
    "/get_server_info": orjson.dumps({"max_total_num_tokens": 10_000_000, "dp_size": 1}),
    "/v1/models": orjson.dumps({"object": "list", "data": [{"id": MODEL}]}),
    "/v1/loads": orjson.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}),
    "/health": b"",
}


async def upstream_app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """The instant backend (ASGI)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()  # type: ignore[operator]
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path in _INFO:
        payload, ctype = _INFO[path], b"application/json"
    elif b'"stream":true' in body:
        payload, ctype = _STREAM, b"text/event-stream"
    else:
        payload, ctype = _JSON, b"application/json"
    await send(
        {
            "type": "http.response.start",
            "status": 200,  # type: ignore[operator]
            "headers": [(b"content-type", ctype), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})  # type: ignore[operator]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(url)


@contextlib.contextmanager
def _process(args: list[str], ready: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(ready)
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def instant_stack(gateway_args: list[str]) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """The instant upstream and a gateway in front of it, each in its own process: (upstream URL,
    gateway URL, gateway process). ``gateway_args`` are added to ``cachegate serve``'s."""
    up_port, gw_port = _free_port(), _free_port()
    up, gw = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{gw_port}"
    upstream = [sys.executable, "-m", "uvicorn", "loadtest.bench.overhead:upstream_app", "--port", str(up_port)]
    upstream += ["--log-level", "warning", "--loop", "uvloop", "--http", "httptools", "--no-access-log"]
    gateway = [sys.executable, "-m", "gateway.cli", "serve", "--backend", up, "--model", MODEL]
    gateway += ["--port", str(gw_port), "--log-level", "warning", *gateway_args]
    with _process(upstream, up + "/health"), _process(gateway, gw + "/readyz") as gw_proc:
        yield up, gw, gw_proc


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _body(stream: bool) -> dict[str, object]:
    return {
        "model": MODEL,
        "stream": stream,
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": "You are a coding agent. " * 40},
            {"role": "user", "content": "Fix the bug in main.py. " * 20},
        ],
    }


def sequential(url: str, n: int, stream: bool) -> list[float]:
    out = []
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            start = time.perf_counter()
            if stream:
                with client.stream("POST", url + "/v1/chat/completions", json=_body(True)) as r:
                    for _ in r.iter_raw():
                        pass
            else:
                r = client.post(url + "/v1/chat/completions", json=_body(False))
            assert r.status_code == 200, r.status_code
            out.append(time.perf_counter() - start)
    return sorted(out)


async def concurrent(url: str, workers: int, seconds: float) -> int:
    done = 0
    stop = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=workers)) as client:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop:
                r = await client.post(url + "/v1/chat/completions", json=_body(False))
                assert r.status_code == 200
                done += 1

        await asyncio.gather(*(worker() for _ in range(workers)))
    return done


def _q(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--policy", default="gateway")
    args = parser.parse_args()
    with instant_stack(["--policy", args.policy]) as (up, gw, gw_proc):
        print(f"policy {args.policy}; {args.requests} sequential requests each way; instant upstream")
        print("| request | direct p50 | direct p99 | gateway p50 | gateway p99 | added p50 | added p99 |")
        print("|---|---|---|---|---|---|---|")
        for stream in (False, True):
            sequential(gw, 50, stream)  # warm both paths
            direct, via = sequential(up, args.requests, stream), sequential(gw, args.requests, stream)
            print(
                f"| {'stream' if stream else 'non-stream'} | {_q(direct, 0.5):.2f} ms | {_q(direct, 0.99):.2f} ms | "
                f"{_q(via, 0.5):.2f} ms | {_q(via, 0.99):.2f} ms | {_q(via, 0.5) - _q(direct, 0.5):.2f} ms | "
                f"{_q(via, 0.99) - _q(direct, 0.99):.2f} ms |"
            )
        cpu0, t0 = _cpu_seconds(gw_proc.pid), time.perf_counter()
        done = asyncio.run(concurrent(gw, args.concurrency, args.seconds))
        cpu, wall = _cpu_seconds(gw_proc.pid) - cpu0, time.perf_counter() - t0
        print(
            f"\n{args.concurrency} concurrent clients for {wall:.1f} s: {done / wall:.0f} requests/s through the "
            f"gateway, gateway CPU {cpu:.1f} s ({cpu / wall:.2f} cores): {done / cpu:.0f} requests per CPU-second"
        )


if __name__ == "__main__":
    main()
