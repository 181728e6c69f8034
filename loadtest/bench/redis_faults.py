"""Team limits through Redis faults: the peak of leases in use against the limit.

Run from ``python -m loadtest.bench.redis_cost --only faults --only live [--faults N] [--root DIR]``:

- ``faults``: two replicas as two ``RedisState`` objects in one event loop (the leases in use are
  counted exactly), 6 workers each holding a lease 50-400 ms, limit 4, heartbeat 0.25 s; a Redis
  restart (no persistence) and a ``FLUSHALL`` alternated every second.
- ``live``: two ``cachegate serve`` processes (one worker each) in front of one simulated SGLang
  server, which counts the requests it runs at once; 10 clients streaming; the team limit is 4;
  Redis restarted twice, then flushed, every 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import redis
import yaml

from loadtest.bench.procs import RedisServer
from loadtest.bench.procs import free_port as _free_port
from loadtest.bench.procs import process as _process


def faults(root: str, count: int, limit: int = 4) -> None:
    sys.path.insert(0, root)
    import random

    from gateway.state.replicas import RedisState

    server = RedisServer()
    server.start()
    stats = {"live": 0, "peak": 0, "grants": 0}
    stopping = False

    async def worker(state: RedisState, n: int) -> None:
        i = 0
        while not stopping:
            rid = f"{state.replica}-{n}-{i}"
            i += 1
            if not await state.acquire("t", rid, limit):
                await asyncio.sleep(0.005)
                continue
            stats["live"] += 1
            stats["grants"] += 1
            stats["peak"] = max(stats["peak"], stats["live"])
            await asyncio.sleep(random.uniform(0.05, 0.4))
            stats["live"] -= 1
            await state.release("t", rid)

    async def run() -> tuple[float, int]:
        nonlocal stopping
        url = f"redis://127.0.0.1:{server.port}/0"
        states = [RedisState(url, lease_ttl_s=2.0, heartbeat_s=0.25) for _ in range(2)]
        for st in states:
            await st.start()
        tasks = [asyncio.create_task(worker(st, n)) for st in states for n in range(6)]
        recover: list[float] = []
        for k in range(count):
            await asyncio.sleep(1.0)
            t0 = time.monotonic()
            if k % 2 == 0:  # in threads: the replicas' event loop must not stall
                await asyncio.to_thread(server.stop)
                await asyncio.sleep(0.3)
                await asyncio.to_thread(server.start)
            else:
                await asyncio.to_thread(lambda: redis.Redis(port=server.port).flushall())
            shared = lambda: [st.status()["mode"] == "redis" for st in states]  # noqa: E731
            while any(shared()) and time.monotonic() - t0 < 3:
                await asyncio.sleep(0.01)
            while not all(shared()) and time.monotonic() - t0 < 30:
                await asyncio.sleep(0.01)
            recover.append(time.monotonic() - t0)
        stopping = True
        await asyncio.gather(*tasks)
        changes = sum(st.status().get("transitions", -1) for st in states)
        for st in states:
            await st.stop()
        return max(recover), changes

    try:
        worst, changes = asyncio.run(run())
    finally:
        server.remove()
    print(
        f"4. {count} Redis faults ({(count + 1) // 2} restarts, {count // 2} flushes), 2 replicas x 6 workers, "
        f"holds 50-400 ms: peak {stats['peak']} leases in use, limit {limit}; {stats['grants']} grants; "
        f"back to shared within {worst:.1f} s; {changes} mode changes in all (2 per fault per replica: "
        f"{4 * count})"
    )


def live(root: str, count: int) -> None:
    from backends.sim.testing import run_twin, twin_of

    model = "moonshotai/Kimi-K2-Instruct"
    server = RedisServer()
    server.start()
    results: list[int] = []
    stop = threading.Event()
    try:
        with tempfile.TemporaryDirectory() as tmp, run_twin("tiny", time_scale=1.0, model=model) as twin:
            cfg = Path(tmp) / "c.yaml"
            cfg.write_text(
                yaml.safe_dump(
                    {
                        "models": {"kimi": {"upstream_model": model, "backends": [{"url": twin}]}},
                        "teams": {"default": {"max_concurrency": 4, "max_queue": 100, "queue_timeout_s": 60}},
                        "health": {"interval_s": 0.5, "load_interval_s": 0.5},
                        "lease_ttl_s": 2.0,
                        "workers": 1,
                        "redis_url": f"redis://127.0.0.1:{server.port}/0",
                        "log_level": "warning",
                    }
                )
            )
            bases = []
            with contextlib.ExitStack() as stack:
                for _ in range(2):
                    port = _free_port()
                    stack.enter_context(
                        _process(
                            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)],
                            cwd=root,
                            ready=f"http://127.0.0.1:{port}/readyz",
                        )
                    )
                    bases.append(f"http://127.0.0.1:{port}")
                time.sleep(3)
                mode = lambda b: httpx.get(b + "/readyz", timeout=5).json()["state"]  # noqa: E731

                def client(w: int) -> None:
                    body = {
                        "model": "kimi",
                        "stream": True,
                        "max_tokens": 30,
                        "messages": [{"role": "user", "content": f"conversation {w}: " + "x" * 2000}],
                    }
                    while not stop.is_set():
                        with httpx.stream("POST", bases[w % 2] + "/v1/chat/completions", json=body, timeout=60) as r:
                            for _ in r.iter_raw():
                                pass
                        results.append(r.status_code)

                twin_of(twin).max_live = 0
                threads = [threading.Thread(target=client, args=(w,)) for w in range(10)]
                for t in threads:
                    t.start()
                worst = 0.0
                for k in range(count):
                    time.sleep(2.0)
                    t0 = time.monotonic()
                    if k % 3 == 2:
                        redis.Redis(port=server.port).flushall()
                    else:
                        server.stop()
                        time.sleep(0.5)
                        server.start()
                    while time.monotonic() - t0 < 0.5 or any(mode(b)["mode"] != "redis" for b in bases):
                        if time.monotonic() - t0 > 30:
                            break
                        time.sleep(0.05)
                    worst = max(worst, time.monotonic() - t0)
                time.sleep(1)
                stop.set()
                for t in threads:
                    t.join(60)
                changes = [mode(b).get("transitions") for b in bases]
            peak = twin_of(twin).max_live
    finally:
        stop.set()
        server.remove()
    restarts = count - count // 3
    print(
        f"5. Live: {count} Redis faults ({restarts} restarts, {count - restarts} flushes), 2 gateways, 10 streaming "
        f"clients: {len(results)} requests, statuses {sorted(set(results))}; peak {peak} running at the backend, "
        f"team limit 4; back to shared within {worst:.1f} s; mode changes per replica {changes}"
    )
