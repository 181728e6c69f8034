"""The ``slow`` run: many slow or idle connections held against one replica, normal requests timed meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

from loadtest.chaos.load import Load, Tally, quantile
from loadtest.chaos.stack import Stack, proc_stats


async def run_slow(connections: int, hold_s: float, rate: float = 8.0, out: Any = print) -> dict[str, Any]:
    """``connections`` slow or idle connections held ``hold_s`` (reopened when the gateway closes them),
    normal requests at ``rate``/s meanwhile; p99 against an unloaded run, then fds back to baseline."""
    stack = Stack(twins=1, replicas=1, limit=64, redis=False, header_timeout_s=10.0)
    await stack.start()
    pid = stack.pids()[0]
    host, port = "127.0.0.1", stack.replica_procs[0].port
    result: dict[str, Any] = {}
    try:
        _, base_fds = proc_stats(pid)
        unloaded = await _timed_load(stack, rate, 20)
        # The attackers run in a process of their own, so that their work does not slow the client
        # that measures the normal requests.
        attack = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            f"import asyncio; from loadtest.chaos.slow import attack; "
            f"asyncio.run(attack({host!r}, {port}, {connections}, {hold_s}))",
            stdout=asyncio.subprocess.PIPE,
        )
        attack_started = time.monotonic()
        await asyncio.sleep(5)
        _, peak_fds = proc_stats(pid)
        loaded = await _timed_load(stack, rate, min(hold_s - 10, 100))
        await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - attack_started)))
        _, held_fds = proc_stats(pid)  # the attack has stopped opening connections: the gateway closes the rest
        t0 = attack_started + hold_s
        back = None
        while time.monotonic() - t0 < 30:
            _, fds = proc_stats(pid)
            if fds <= base_fds + 5:
                back = time.monotonic() - t0
                break
            await asyncio.sleep(0.25)
        output, _ = await attack.communicate()
        closed = [0.0] * int(output.decode().strip().splitlines()[-1] or 0)
        result = {
            "unloaded_p99": quantile(unloaded.latencies, 0.99),
            "loaded_p99": quantile(loaded.latencies, 0.99),
            "errors": dict(loaded.errors),
            "base_fds": base_fds,
            "peak_fds": peak_fds,
            "held_fds": held_fds,
            "fds_back_s": back,
            "closed_by_gateway": len(closed),
        }
        out(
            f"{connections} slow connections held {hold_s:g} s: p99 unloaded {result['unloaded_p99']:.3f} s, "
            f"loaded {result['loaded_p99']:.3f} s ({result['loaded_p99'] / result['unloaded_p99']:.2f}x), errors "
            f"{result['errors']}; fds baseline {base_fds}, with them {peak_fds}, at the end {held_fds}; "
            f"closed by the gateway {len(closed)} times; fds back to baseline "
            f"{f'after {back:.1f} s' if back is not None else 'NOT within 30 s'}"
        )
    finally:
        await stack.close()
    return result


async def _timed_load(stack: Stack, rate: float, seconds: float) -> Tally:
    load = Load(stack, rate=rate, seed=7)
    load.start()
    await asyncio.sleep(seconds)
    await load.stop()
    return load.tally


async def attack(host: str, port: int, connections: int, hold_s: float) -> None:
    """``connections`` slow or idle connections for ``hold_s`` seconds, reopened whenever the gateway
    closes one; then no new ones, and the open ones left for the gateway to close. Prints how often it
    closed one (run in its own process by ``run_slow``). One task per connection waits for its close;
    one loop dribbles a byte per second into the slow half (cheap: the attacker's CPU is not the point)."""
    stop = asyncio.Event()
    closed: list[float] = []
    slow: set[asyncio.StreamWriter] = set()

    async def dribble() -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            for writer in list(slow):
                with contextlib.suppress(Exception):
                    writer.write(b"x")

    async def one(i: int) -> None:
        await asyncio.sleep(i * 0.002)
        while not stop.is_set():
            writer = None
            try:
                reader, writer = await asyncio.open_connection(host, port)
                if i % 2:
                    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    slow.add(writer)
                t0 = time.monotonic()
                await reader.read()  # until the gateway closes it (after its 408)
                closed.append(time.monotonic() - t0)
            except (OSError, ConnectionError):
                await asyncio.sleep(0.5)
            finally:
                if writer is not None:
                    slow.discard(writer)
                    writer.close()

    tasks = [asyncio.create_task(one(i)) for i in range(connections)]
    dribbler = asyncio.create_task(dribble())
    await asyncio.sleep(hold_s)
    stop.set()
    await asyncio.wait(tasks, timeout=60)
    dribbler.cancel()
    print(len(closed), flush=True)
