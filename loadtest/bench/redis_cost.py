"""Workers and Redis: what a request costs in Redis, what holding leases costs, and Redis faults (how
workers scale: ``cachegate bench --scaling``, ``loadtest/bench/scale.py``).

    python -m loadtest.bench.redis_cost [--seconds 8] [--concurrency 32] [--root DIR]

Starts a private ``redis-server`` (no persistence), an instant upstream (raw asyncio, its own
process) and ``cachegate serve --redis-url`` against it, then prints:

1. Redis commands per request on the common path (the team limit is never reached), from
   ``INFO commandstats`` around a load run, less the heartbeats (measured idle just before):
   every command, including those run inside Lua scripts, and the script calls (round trips).
2. Renewal traffic: commands per second of one replica holding 10 and then 1,000 leases, idle.
3. Through ``--faults`` Redis faults (restarts without persistence and ``FLUSHALL``): the peak of
   leases in use against the team limit (``loadtest/bench/redis_faults.py``), in process (two
   ``RedisState`` objects) and live (two gateway processes; requests at once at a twin).

``--root DIR`` runs the gateway (and imports ``gateway.state.replicas``) from another checkout, e.g. the
code before a change, so a before/after comparison is two runs of this same script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import redis
import yaml

from loadtest.bench.procs import free_port as _free_port
from loadtest.bench.procs import process as _process

MODEL = "bench-model"
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
    b"/get_server_info": orjson.dumps({"max_total_num_tokens": 100_000_000, "dp_size": 1}),
    b"/v1/models": orjson.dumps({"object": "list", "data": [{"id": MODEL}]}),
    b"/v1/loads": orjson.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}),
}
_BODY = orjson.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi " * 50}]})


class _Upstream(asyncio.Protocol):
    """An instant SGLang-like backend: HTTP/1.1 keep-alive, a fixed answer per path."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            i = head.find(b"content-length:")
            length = int(head[i + 15 : head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None]) if i >= 0 else 0
            if len(self.buf) < head_end + 4 + length:
                return
            path = head.split(b" ", 2)[1]
            self.buf = self.buf[head_end + 4 + length :]
            payload = _INFO.get(path, b"" if path == b"/health" else _JSON)
            self.t.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(payload), payload)
            )


def serve_upstream(port: int) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


async def load(port: int, concurrency: int, seconds: float) -> int:
    """Keep-alive POSTs from ``concurrency`` connections for ``seconds``; returns answers (all 200)."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
    )
    done = 0
    stop = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < stop:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.decode(errors="replace"))
                i = head.lower().find(b"content-length:")
                await reader.readexactly(int(head[i + 15 : head.find(b"\r\n", i)]))
                done += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return done


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    port, folder = _free_port(), tempfile.mkdtemp(prefix="cg-bench-redis-")
    args = [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        folder,
    ]
    try:
        with _process(args):
            client = redis.Redis(port=port)
            for _ in range(100):
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def calls(url: str) -> dict[str, int]:
    stats = redis.Redis.from_url(url).info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


@contextlib.contextmanager
def gateway(root: str, upstream: str, redis_url: str, workers: int, folder: Path) -> Iterator[tuple[int, int]]:
    port = _free_port()
    cfg = folder / f"gw-{port}.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": {MODEL: {"backends": [{"url": upstream}]}},
                "redis_url": redis_url,
                "workers": workers,
                "teams": {"default": {"max_concurrency": 1000, "max_queue": 1000}},
                "log_level": "warning",
            }
        )
    )
    args = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--config",
        str(cfg),
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with _process(args, cwd=root, ready=f"http://127.0.0.1:{port}/readyz") as proc:
        yield port, proc.pid


def per_request(root: str, upstream: str, folder: Path, concurrency: int, seconds: float) -> None:
    with _redis() as url, gateway(root, upstream, url, 1, folder) as (port, _):
        asyncio.run(load(port, concurrency, 1.0))  # warm up
        time.sleep(0.5)
        b0, t0 = calls(url), time.monotonic()
        time.sleep(3.0)
        idle = _diff(calls(url), b0)
        idle_rate = {k: v / (time.monotonic() - t0) for k, v in idle.items()}
        before, t1 = calls(url), time.monotonic()
        n = asyncio.run(load(port, concurrency, seconds))
        time.sleep(0.2)
        used = _diff(calls(url), before)
        wall = time.monotonic() - t1
        net = {k: v - idle_rate.get(k, 0) * wall - (1 if k == "info" else 0) for k, v in used.items()}
        total = sum(net.values())
        print(
            f"1. Redis commands per request, {n} requests ({n / seconds:.0f}/s, {concurrency} connections, "
            f"1 worker), heartbeats ({sum(idle_rate.values()):.1f} commands/s) taken out:"
        )
        print(
            f"   {total / n:.2f} commands per request, {net.get('evalsha', 0) / n:.2f} script calls; by command: "
            + ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(net.items(), key=lambda kv: -kv[1]) if v / n >= 0.01)
        )


def renewal(root: str, seconds: float) -> None:
    sys.path.insert(0, root)
    from gateway.state.replicas import RedisState

    async def run(url: str) -> dict[int, float]:
        out: dict[int, float] = {}
        state = RedisState(url, lease_ttl_s=10.0)
        await state.start()
        try:
            for held in (10, 1000):
                for i in range(held):
                    await state.acquire(f"team{i % 20}", f"r{held}-{i}", 100_000)
                await asyncio.sleep(1.5)
                before, t0 = calls(url), time.monotonic()
                await asyncio.sleep(seconds)
                out[held] = (sum(_diff(calls(url), before).values()) - 1) / (time.monotonic() - t0)
                for i in range(held):
                    await state.release(f"team{i % 20}", f"r{held}-{i}")
                await asyncio.sleep(0.5)
        finally:
            await state.stop()
        return out

    with _redis() as url:
        rates = asyncio.run(run(url))
    print(
        f"2. Renewal traffic of one idle replica: {rates[10]:.1f} commands/s holding 10 leases, "
        f"{rates[1000]:.1f} commands/s holding 1,000 ({rates[1000] / max(rates[10], 1e-9):.2f}×)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[2]))
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--only", choices=["commands", "renewal", "faults", "live"], action="append")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    from loadtest.bench.redis_faults import faults, live  # not needed by the upstream process

    root = str(Path(args.root).resolve())
    only = set(args.only or ["commands", "renewal", "faults", "live"])
    print(f"gateway code from {root}; {os.cpu_count()} cores; instant upstream; private redis-server")
    up_port = _free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    me = [sys.executable, "-m", "loadtest.bench.redis_cost", "--serve-upstream", str(up_port)]
    with tempfile.TemporaryDirectory() as tmp, _process(me, ready=upstream + "/health"):
        if "commands" in only:
            per_request(root, upstream, Path(tmp), args.concurrency, args.seconds)
        if "renewal" in only:
            renewal(root, 4.0)
    if "faults" in only:
        faults(root, args.faults)
    if "live" in only:
        live(root, args.faults)


if __name__ == "__main__":
    main()
