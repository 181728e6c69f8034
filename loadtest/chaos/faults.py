"""The faults a chaos run injects, and how it sees their effect (detect and recover times, leftovers).

Each fault returns ``{"detect": s | None, "recover": s | None, "errors": Counter}``: ``detect`` is the
time until the gateway showed the fault (a backend out of rotation, Redis mode degraded, a peer
replica gone, a refusal answered), ``recover`` the time until it was back to normal.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import orjson

from loadtest.chaos.stack import TEAMS, Stack


class Probe:
    """Reads the replicas' view (``/readyz`` details, ``/admin/state``) during a run."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.client = httpx.AsyncClient(timeout=2)

    async def close(self) -> None:
        await self.client.aclose()

    async def views(self) -> list[dict[str, Any]]:
        views = await asyncio.gather(*(self.stack.readyz(self.client, u) for u in self.stack.urls))
        return [v for v in views if v]

    async def until(self, pred: Callable[[list[dict[str, Any]]], bool], timeout: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            views = await self.views()
            if views and pred(views):
                return time.monotonic() - t0
            await asyncio.sleep(0.05)
        return None

    async def settle(self, wait_s: float) -> dict[str, Any]:
        """After the load stopped: wait for expiries, then what is still held anywhere."""
        await asyncio.sleep(wait_s)
        states = [await self.stack.admin_state(self.client, u) for u in self.stack.urls]
        inflight = sum(int((s or {}).get("core", {}).get("running", 0)) for s in states)
        waiting = sum(
            int((s or {}).get("core", {}).get("waiting", 0)) + int((s or {}).get("waiting", 0)) for s in states
        )
        return {
            "inflight": inflight,
            "waiting": waiting,
            "leases": self.stack.leases(),
            "at_twins": sum(self.stack.meter.inflight.values()),
            "replicas_answering": sum(1 for s in states if s),
        }


def _healthy(name: str, want: bool) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda views: all(v.get("backends", {}).get(name, {}).get("healthy") is want for v in views)


def _mode(want: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda views: all(v.get("state", {}).get("mode") == want for v in views)


class Fault(Protocol):
    def __call__(self, stack: Stack, probe: Probe, rng: random.Random) -> Awaitable[dict[str, Any]]: ...


async def backend_kill(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    i = rng.randrange(len(stack.twin_procs))
    t0 = time.monotonic()
    stack.twin_procs[i].kill()
    detect = await probe.until(_healthy(f"b{i}", False), 5)
    await asyncio.sleep(max(0.0, 1.5 - (time.monotonic() - t0)))
    stack.restart_twin(i)
    back = await probe.until(_healthy(f"b{i}", True), 20)
    return {"detect": detect, "recover": None if back is None else time.monotonic() - t0}


async def backend_hang(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    i = rng.randrange(len(stack.twin_procs))
    t0 = time.monotonic()
    stack.twin_procs[i].signal(signal.SIGSTOP)
    detect = await probe.until(_healthy(f"b{i}", False), 6)
    await asyncio.sleep(max(0.0, 4.0 - (time.monotonic() - t0)))
    stack.twin_procs[i].signal(signal.SIGCONT)
    back = await probe.until(_healthy(f"b{i}", True), 20)
    return {"detect": detect, "recover": None if back is None else time.monotonic() - t0}


async def backend_5xx(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    i = rng.randrange(len(stack.proxies))
    t0 = time.monotonic()
    stack.proxies[i].set_mode("5xx")
    detect = await probe.until(_healthy(f"b{i}", False), 2.0)
    await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
    stack.proxies[i].set_mode("ok")
    back = await probe.until(_healthy(f"b{i}", True), 20)
    return {"detect": detect, "recover": None if back is None else time.monotonic() - t0}


async def _redis_down(stack: Stack, probe: Probe, down_s: float) -> dict[str, Any]:
    assert stack.redis_proc is not None
    t0 = time.monotonic()
    stack.redis_proc.stop()
    detect = await probe.until(_mode("degraded"), max(down_s, 4.0)) if down_s else None
    await asyncio.sleep(max(0.0, down_s - (time.monotonic() - t0)))
    stack.start_redis()
    back = await probe.until(_mode("redis"), 20)
    return {"detect": detect, "recover": None if back is None else time.monotonic() - t0}


async def redis_stop(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    return await _redis_down(stack, probe, 4.0)


async def redis_restart(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    result = await _redis_down(stack, probe, 0.0)
    await asyncio.sleep(2.0)  # let the load run on the fresh Redis (where limits were exceeded before)
    return result


async def redis_flush(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    import redis

    client = redis.Redis(port=stack.redis_port, socket_connect_timeout=1)
    with contextlib.suppress(redis.RedisError):
        client.flushall()
    client.close()
    await asyncio.sleep(2.0)
    return {}


async def replica_kill(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    j = rng.randrange(len(stack.replica_procs))
    others = [u for k, u in enumerate(stack.urls) if k != j]
    # Redis members, not processes: each replica runs one per worker (two on 2 cores with Redis)
    before = [v.get("state", {}).get("replicas", 0) for v in [await stack.readyz(probe.client, u) for u in others] if v]
    members = max(before, default=0)
    t0 = time.monotonic()
    stack.replica_procs[j].kill()
    detect = None
    while others and time.monotonic() - t0 < 3 * stack.lease_ttl_s:  # dropped after the lease TTL
        views = [v for v in [await stack.readyz(probe.client, u) for u in others] if v]
        if views and all(v.get("state", {}).get("replicas", members) < members for v in views):
            detect = time.monotonic() - t0
            break
        await asyncio.sleep(0.1)
    stack.start_replica(stack.replica_procs[j])
    url = stack.urls[j]
    back = None
    while time.monotonic() - t0 < 30:
        with contextlib.suppress(httpx.HTTPError):
            if (await probe.client.get(url + "/readyz")).status_code == 200:
                back = time.monotonic() - t0
                break
        await asyncio.sleep(0.1)
    return {"detect": detect, "recover": back}


async def slow_clients(stack: Stack, probe: Probe, rng: random.Random, n: int = 20) -> dict[str, Any]:
    """``n`` connections that send half a header and stall: closed by the gateway's header timeout."""
    url = rng.choice(stack.urls)
    port = int(url.rsplit(":", 1)[1])

    async def one() -> float | None:
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return time.monotonic() - t0
        except (OSError, TimeoutError):
            return None

    closed = [t for t in await asyncio.gather(*(one() for _ in range(n))) if t is not None]
    errors: Counter[str] = Counter()
    if len(closed) < n:
        errors["slow_not_closed"] += n - len(closed)
    return {"recover": max(closed) if closed else None, "errors": errors}


async def _bad_body(stack: Stack, rng: random.Random, raw: bytes, want: set[str]) -> dict[str, Any]:
    url = rng.choice(stack.urls)
    errors: Counter[str] = Counter()
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        try:
            r = await client.post(
                url + "/v1/chat/completions",
                content=raw,
                headers={"authorization": f"Bearer {TEAMS['a']}", "content-type": "application/json"},
            )
            took = time.monotonic() - t0
            code = ""
            with contextlib.suppress(ValueError, KeyError, TypeError):
                code = r.json()["error"]["code"]
            if r.status_code != 400 or code not in want:
                errors[f"bad_body:{r.status_code}:{code}"] += 1
            return {"detect": took, "errors": errors}
        except httpx.HTTPError as exc:
            errors[f"bad_body:transport:{type(exc).__name__}"] += 1
            return {"errors": errors}


async def oversized_body(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    # 55k+ words: 275+ KB, 68k+ tokens at the twin's 4 bytes per token, past the tiny profile's whole
    # 65,536-token KV pool (below that, a prompt under high_water · 65,536 may rightly run)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "word " * rng.randrange(55_000, 140_000)}],
        "user": "a",
    }
    return await _bad_body(stack, rng, orjson.dumps(body), {"context_length_exceeded"})


async def nested_body(stack: Stack, probe: Probe, rng: random.Random) -> dict[str, Any]:
    depth = rng.randrange(65, 2_000)
    raw = b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":' + b"[" * depth + b"]" * depth + b"}"
    return await _bad_body(stack, rng, raw, {"request_too_complex", "invalid_json"})


FAULTS: dict[str, Fault] = {
    f.__name__: f
    for f in (
        backend_kill,
        backend_hang,
        backend_5xx,
        redis_stop,
        redis_restart,
        redis_flush,
        replica_kill,
        slow_clients,
        oversized_body,
        nested_body,
    )
}
