"""Reliability runs against real processes: faults under load, a soak, and many slow connections.

``cachegate chaos`` (gateway/cli.py) runs one of three modes on a private stack
(``loadtest/chaos_stack.py``: a private ``redis-server``, tiny twins behind fault proxies that count
in-flight requests per team at the twins' door, gateway replicas as ``python -m gateway.cli serve``):

- ``faults``: steady load from two teams (limit ``--limit`` each, more workers than the limit, random
  client disconnects) while faults are injected in rounds: backend kill, hang (SIGSTOP) and 5xx
  bursts; Redis stop, restart and flush; replica SIGKILL; slow clients; oversized and deeply nested
  bodies. Per fault kind: injections, requests sent, errors by kind, peak in flight per team at the
  twins against the limit, time to detect and recover; at the end, slots (replicas' in flight and
  waiting) and Redis leases left.
- ``soak``: one replica, a constant modest rate, no faults: RSS, open fds and errors every interval.
- ``slow``: N connections that send headers slowly or nothing, held for a while, with normal requests
  meanwhile (p99 against an unloaded run first), then fds until they return to baseline;
- ``hol``: an oversized prompt retried in a loop while another team uses the same backend.
Figures and commands: docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from loadtest.chaos_faults import FAULTS, Fault, Probe
from loadtest.chaos_stack import TEAMS, Stack, proc_stats


@dataclass
class Tally:
    sent: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


class Load:
    """Closed-loop clients per team (``workers`` each), or open-loop at ``rate`` requests/s overall."""

    def __init__(
        self, stack: Stack, workers: int = 8, disconnect_p: float = 0.0, rate: float | None = None, seed: int = 1
    ) -> None:
        self.stack = stack
        self.workers = workers
        self.disconnect_p = disconnect_p
        self.rate = rate
        self.rng = random.Random(seed)
        self.tally = Tally()
        self.disconnects = 0
        self.stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(60, connect=5),
            limits=httpx.Limits(max_connections=400, max_keepalive_connections=100),
        )
        self._n = 0

    def start(self) -> None:
        if self.rate:
            self._tasks.append(asyncio.create_task(self._open_loop()))
        else:
            self._tasks += [asyncio.create_task(self._worker(team)) for team in TEAMS for _ in range(self.workers)]

    async def stop(self) -> None:
        """Stop sending; requests still open are cancelled (not counted) before the client closes."""
        self.stopping = True
        for task in [*self._tasks, *self._pending]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._pending, return_exceptions=True)
        await self.client.aclose()

    async def _worker(self, team: str) -> None:
        while not self.stopping:
            await self.one(team)

    async def _open_loop(self) -> None:
        assert self.rate
        while not self.stopping:
            team = self.rng.choice(list(TEAMS))
            task = asyncio.create_task(self.one(team))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            await asyncio.sleep(self.rng.expovariate(self.rate))

    def body(self, team: str) -> dict[str, Any]:
        self._n += 1
        conv = self.rng.randrange(40)
        text = f"conversation {conv} " + "lorem ipsum dolor sit amet " * self.rng.randrange(20, 200)
        return {
            "model": "m",
            "messages": [{"role": "user", "content": text}],
            "user": team,
            "max_tokens": self.rng.randrange(8, 48),
            "stream": self.rng.random() < 0.5,
        }

    async def one(self, team: str) -> None:
        urls = self.stack.urls
        url = urls[self._n % len(urls)]
        body = self.body(team)
        leave = self.rng.random() < self.disconnect_p
        self.tally.sent += 1
        started = time.monotonic()
        kind = "ok"
        try:
            coro = self._send(url, team, body)
            if leave:
                try:
                    await asyncio.wait_for(coro, self.rng.uniform(0.0, 0.6))
                except TimeoutError:
                    self.disconnects += 1
                    kind = "client_left"
            else:
                kind = await coro
        except httpx.HTTPError as exc:
            kind = f"transport:{type(exc).__name__}"
            await asyncio.sleep(0.2)  # a dead replica: do not spin
        except Exception as exc:  # a worker that dies would silently stop the load
            kind = f"client:{type(exc).__name__}"
        if kind == "ok":
            self.tally.latencies.append(time.monotonic() - started)
        elif kind != "client_left":
            self.tally.errors[kind] += 1

    async def _send(self, url: str, team: str, body: dict[str, Any]) -> str:
        headers = {"authorization": f"Bearer {TEAMS[team]}"}
        async with self.client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
            raw = await r.aread()
        if r.status_code == 200:
            if body["stream"] and (b'"error"' in raw and b"data: [DONE]" in raw):
                return "stream_error_event"
            return "ok"
        code = ""
        with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
            payload = r.json()
            code = "engine" if payload.get("object") == "error" else payload["error"]["code"] or ""
        return f"{r.status_code}:{code}"


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def run_faults(
    total: int,
    replicas: int = 2,
    limit: int = 4,
    seed: int = 1,
    redis_restarts: int = 10,
    skip: tuple[str, ...] = (),
    out: Any = print,
) -> dict[str, Any]:
    """Inject about ``total`` faults of every kind across ``replicas`` replicas on Redis; print the table."""
    stack = Stack(twins=2, replicas=replicas, limit=limit)
    rng = random.Random(seed)
    await stack.start()
    load = Load(stack, workers=2 * limit, disconnect_p=0.15, seed=seed)
    probe = Probe(stack)
    rows: dict[str, dict[str, Any]] = {}
    try:
        load.start()
        await asyncio.sleep(3)
        plan = {k: n for k, n in _plan(total, redis_restarts).items() if k not in skip}
        t_start = time.monotonic()
        order = [k for k, n in plan.items() for _ in range(n)]
        rng.shuffle(order)
        # Cheap faults come many at a time; each injection counts once.
        for kind in order:
            fault: Fault = FAULTS[kind]
            row = rows.setdefault(
                kind, {"n": 0, "sent": 0, "errors": Counter(), "peak": Counter(), "detect": [], "recover": []}
            )
            sent0, errors0 = load.tally.sent, Counter(load.tally.errors)
            stack.meter.reset_peaks()
            result = await fault(stack, probe, rng)
            row["n"] += 1
            row["sent"] += load.tally.sent - sent0
            row["errors"].update(load.tally.errors - errors0)
            row["errors"].update(result.get("errors", Counter()))
            for team, peak in stack.meter.peak.items():
                row["peak"][team] = max(row["peak"][team], peak)
            for key in ("detect", "recover"):
                if result.get(key) is not None:
                    row[key].append(result[key])
            if kind not in ("oversized_body", "nested_body"):  # the timeline of the slow faults
                out(
                    f"  t={time.monotonic() - t_start:6.1f} s {kind:<15} sent {load.tally.sent - sent0:4d} "
                    f"peak {dict(stack.meter.peak)} errors {dict(load.tally.errors - errors0)}"
                )
        rows["client_disconnect"] = {
            "n": load.disconnects,
            "sent": 0,
            "errors": Counter(),
            "peak": Counter(),
            "detect": [],
            "recover": [],
        }
    finally:
        await load.stop()
        end = await probe.settle(stack.lease_ttl_s + 3)
        await probe.close()
        end["degraded"] = stack.log_count(b"DEGRADED MODE")
        end["redis_back"] = stack.log_count(b"shared through Redis across")
        await stack.close()
    faults = sum(r["n"] for r in rows.values())
    _print_table(rows, limit, out)
    out(
        f"faults injected: {faults}; requests sent: {load.tally.sent}; "
        f"ok: {len(load.tally.latencies)}; errors: {sum(load.tally.errors.values())}"
    )
    out(
        f"left at the end: slots in flight {end['inflight']}, waiting {end['waiting']}, "
        f"Redis leases {end['leases']}, at the twins {end['at_twins']}"
    )
    out(f"replica logs: {end['degraded']} switches to degraded mode, {end['redis_back']} back to shared")
    peak = max((max(r["peak"].values(), default=0) for r in rows.values()), default=0)
    out(
        f"peak in flight per team at the twins: {peak} (limit {limit}) -> "
        f"{'PASS' if peak <= limit else 'FAIL'}; leaks: "
        f"{'PASS' if end['inflight'] == end['waiting'] == end['leases'] == 0 else 'FAIL'}"
    )
    return {"rows": rows, "end": end, "faults": faults, "peak": peak}


def _plan(total: int, redis_restarts: int) -> dict[str, int]:
    heavy = {
        "backend_kill": 4,
        "backend_hang": 4,
        "backend_5xx": 8,
        "redis_stop": 3,
        "redis_restart": redis_restarts,
        "redis_flush": 3,
        "replica_kill": 3,
        "slow_clients": 6,
    }
    rest = max(0, total - sum(heavy.values()) - 40)  # at least 40 client disconnects come from the load
    heavy["oversized_body"] = rest // 2
    heavy["nested_body"] = rest - rest // 2
    return heavy


def _print_table(rows: dict[str, dict[str, Any]], limit: int, out: Any) -> None:
    out(f"{'fault':<18} {'n':>5} {'sent':>6} {'peak a/b (lim)':>15} {'detect s':>9} {'recover s':>9}  errors")
    for kind, r in rows.items():
        peak = f"{r['peak'].get('a', 0)}/{r['peak'].get('b', 0)} ({limit})"
        det = f"{max(r['detect']):.2f}" if r["detect"] else "-"
        rec = f"{max(r['recover']):.2f}" if r["recover"] else "-"
        errs = ", ".join(f"{k} {v}" for k, v in r["errors"].most_common(6)) or "-"
        out(f"{kind:<18} {r['n']:>5} {r['sent']:>6} {peak:>15} {det:>9} {rec:>9}  {errs}")


async def run_soak(
    minutes: float, rate: float, interval_s: float = 30.0, warmup_minutes: float = 3.0, out: Any = print
) -> dict[str, Any]:
    """One replica on Redis, open-loop load at ``rate`` req/s, no faults: RSS, fds and errors over time."""
    stack = Stack(twins=1, replicas=1, limit=16)
    await stack.start()
    load = Load(stack, rate=rate)
    samples: list[tuple[float, float, int, int, int]] = []
    started = time.monotonic()
    try:
        load.start()
        out(f"{'min':>6} {'rss MB':>8} {'fds':>5} {'sent':>7} {'errors':>7}  p50 s")
        while time.monotonic() - started < minutes * 60:
            await asyncio.sleep(interval_s)
            rss, fds = proc_stats(stack.pids()[0])
            t = (time.monotonic() - started) / 60
            errors = sum(load.tally.errors.values())
            samples.append((t, rss, fds, load.tally.sent, errors))
            p50 = _p(load.tally.latencies[-500:], 0.5)
            out(f"{t:6.1f} {rss:8.1f} {fds:5d} {load.tally.sent:7d} {errors:7d}  {p50:.3f}")
    finally:
        await load.stop()
        await stack.close()
    after = [s for s in samples if s[0] >= warmup_minutes] or samples
    growth = (after[-1][1] - after[0][1]) / after[0][1] * 100 if after else float("nan")
    fds = [s[2] for s in after]
    out(
        f"RSS after warm-up {after[0][1]:.1f} -> {after[-1][1]:.1f} MB ({growth:+.1f}%), fds {min(fds)}-{max(fds)}, "
        f"requests {load.tally.sent}, errors {dict(load.tally.errors)}"
    )
    return {
        "growth_pct": growth,
        "fds": (min(fds), max(fds)),
        "errors": sum(load.tally.errors.values()),
        "sent": load.tally.sent,
    }


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
            f"import asyncio; from loadtest.chaos import attack; "
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
            "unloaded_p99": _p(unloaded.latencies, 0.99),
            "loaded_p99": _p(loaded.latencies, 0.99),
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


async def run_hol(seconds: float = 30.0, out: Any = print) -> dict[str, Any]:
    """Head-of-line check: team ``a`` retries a prompt no backend can hold in a loop while team ``b``
    sends normal requests to the same (single) backend; b's latency against a run without a."""
    stack = Stack(twins=1, replicas=1, limit=8, redis=False)
    await stack.start()
    url = stack.urls[0]
    oversized = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "word " * 140_000}], "user": "a"}
    )  # encoded once: the client's own encoding is not the gateway's time
    refusals: list[float] = []
    codes: Counter[str] = Counter()
    stop = asyncio.Event()

    async def hammer() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                r = await client.post(
                    url + "/v1/chat/completions",
                    content=oversized,
                    headers={"authorization": f"Bearer {TEAMS['a']}", "content-type": "application/json"},
                )
                refusals.append(time.monotonic() - t0)
                codes[f"{r.status_code}:{r.json().get('error', {}).get('code')}"] += 1

    try:
        alone = await _team_b(stack, seconds)
        task = asyncio.create_task(hammer())
        await asyncio.sleep(1)
        with_hol = await _team_b(stack, seconds)
        stop.set()
        await task
    finally:
        await stack.close()
    res = {
        "refusal_p50": _p(refusals, 0.5),
        "refusal_p99": _p(refusals, 0.99),
        "refusal_max": max(refusals),
        "refused": dict(codes),
        "b_p99_alone": _p(alone.latencies, 0.99),
        "b_p99_with": _p(with_hol.latencies, 0.99),
        "b_max_alone": max(alone.latencies),
        "b_max_with": max(with_hol.latencies),
        "b_errors": dict(with_hol.errors),
    }
    out(
        f"oversized prompt: {len(refusals)} tries {dict(codes)}, refused in p50 {res['refusal_p50'] * 1e3:.1f} ms, "
        f"p99 {res['refusal_p99'] * 1e3:.1f} ms, max {res['refusal_max'] * 1e3:.1f} ms"
    )
    out(
        f"team b on the same backend: p99 {res['b_p99_alone']:.3f} s alone, {res['b_p99_with']:.3f} s meanwhile "
        f"(max {res['b_max_alone']:.3f} / {res['b_max_with']:.3f} s), errors {res['b_errors']}"
    )
    return res


async def _team_b(stack: Stack, seconds: float) -> Tally:
    load = Load(stack, workers=4, seed=3)
    load._tasks = [asyncio.create_task(load._worker("b")) for _ in range(4)]
    await asyncio.sleep(seconds)
    await load.stop()
    return load.tally
