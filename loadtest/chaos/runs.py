"""Reliability runs against real processes: faults under load and a soak here, slow connections and hol re-exported.

``cachegate chaos`` (gateway/cli.py) runs one of three modes on a private stack
(``loadtest/chaos/stack.py``: a private ``redis-server``, tiny twins behind fault proxies that count
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
The client load is ``loadtest/chaos/load.py``; ``slow`` is ``loadtest/chaos/slow.py``, ``hol``
``loadtest/chaos/hol.py``. Figures and commands: docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from typing import Any

from loadtest.chaos.faults import FAULTS, Fault, Probe
from loadtest.chaos.hol import run_hol
from loadtest.chaos.load import Load, quantile
from loadtest.chaos.slow import attack, run_slow
from loadtest.chaos.stack import Stack, proc_stats

__all__ = ["attack", "run_faults", "run_hol", "run_slow", "run_soak"]


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
            p50 = quantile(load.tally.latencies[-500:], 0.5)
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
