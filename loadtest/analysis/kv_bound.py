"""The GPU pool's bound on waiting: a lower bound on the mean TTFT that no admission or routing policy
can beat when the running requests' contexts outgrow the GPU pool (docs/benchmarks.md, "fp8 KV + host
cache").

SGLang runs a request only with its whole KV on the device: a HiCache hit is loaded back host → device
before the request's prefill (``mem_cache/unified_radix_cache.py::load_back``; the scheduler first
budgets the loaded tokens + the new tokens + the reserved output, ``managers/schedule_policy.py``). The
host tier holds the cache of thinking conversations, not the KV of running ones.

From one closed-loop run's requests, per segment (``segment_s``) of the measured window:

- ``inflight``: requests sent and not finished (their conversations are not thinking), sampled every 2 s;
- ``fit``: the most of them the GPU pool ``C`` can run at once, smallest contexts first, each counted
  without its conversation's shared system prompt (the prompts' prefixes counted once): an optimistic
  packing that also ignores the output each running request adds;
- so at least ``inflight − fit`` requests wait at every instant, and by Little's law the requests of that
  segment wait ``W ≥ (inflight − fit) / X`` on average (``X``: requests completed per second).

A closed loop of ``N`` conversations keeps ``inflight = N − X·Z`` (``Z``: think time) whatever the policy,
so at the same throughput the bound holds for every policy. With the longest wait at most ``M``, a mean
wait ``m`` forces ``p95 ≥ (m − 0.05·M) / 0.95``: a p95 under ``T`` needs ``m ≤ 0.95·T + 0.05·M``; segment by
segment (``shaped_p95_floor``) the same holds for each segment's mean, which is sharper when the waits
grow over the window.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from loadtest.results.metrics import percentile, ttft_samples
from loadtest.sim.simulate import SimConfig, Simulator, build_core, default_engine_factory
from loadtest.workloads.core import ASSISTANTS, PREFIX_TOKENS
from loadtest.workloads.spec import make_workload


def measure(cfg: SimConfig, segment_s: float = 100.0, sample_s: float = 2.0) -> dict[str, Any]:
    """Run ``cfg`` (one backend, closed loop) and return Little's-law figures and the pool's bound."""
    core = build_core(cfg.policy, cfg.admission, cfg.routing)
    engine = default_engine_factory(cfg)()
    workload = make_workload(cfg.workload, seed=cfg.seed, scale=cfg.scale, think_scale=cfg.think_scale)
    sim = Simulator(cfg, core, {"b0": engine}, workload, None)
    records = sim.run()
    start, end = sim.warm, sim.end
    pool = engine.max_total_num_tokens
    prefix = round(PREFIX_TOKENS * cfg.scale)
    done = [r for r in records if r.ok and r.finish is not None and start <= r.finish < end]
    window = end - start
    x = len(done) / window
    by_slot: dict[int | None, list[Any]] = {}
    for r in sorted(records, key=lambda r: r.arrival):
        by_slot.setdefault(r.slot, []).append(r)
    thinks = [
        b.arrival - a.finish
        for rs in by_slot.values()
        for a, b in itertools.pairwise(rs)
        if a.finish is not None and start <= a.finish < end
    ]
    ttfts = ttft_samples(records, start, end)
    live = [(r.arrival, r.finish if r.finish is not None else float("inf"), r.prompt_tokens) for r in records if r.ok]
    segments = []
    t0 = start
    while t0 < end - 1e-9:
        t1 = min(end, t0 + segment_s)
        inflight, queued = [], []
        t = t0
        while t < t1:
            ctx = sorted(p - prefix for a, f, p in live if a <= t < f)
            used, fit = ASSISTANTS * prefix, 0
            for c in ctx:
                if used + c > pool:
                    break
                used += c
                fit += 1
            inflight.append(len(ctx))
            queued.append(len(ctx) - fit)
            t += sample_s
        completed = sum(1 for r in done if t0 <= r.finish < t1)  # type: ignore[operator]
        arrived = [r for r in records if t0 <= r.arrival < t1]
        waits = [r.first_token - r.arrival for r in arrived if r.first_token is not None]
        xs = completed / (t1 - t0)
        segments.append(
            {
                "start_s": t0,
                "inflight": statistics.mean(inflight),
                "queued_at_least": statistics.mean(queued),
                "x_per_s": xs,
                "wait_bound_s": statistics.mean(queued) / xs if xs else None,
                "wait_mean_s": statistics.mean(waits) if waits else None,
                "requests": len(arrived),
            }
        )
        t0 = t1
    weighted = [(s["wait_bound_s"], s["requests"]) for s in segments if s["wait_bound_s"] is not None]
    n = sum(w for _, w in weighted)
    return {
        "conversations": cfg.conversations,
        "pool_tokens": pool,
        "x_per_s": x,
        "think_s": statistics.mean(thinks) if thinks else None,
        "response_s": statistics.mean(r.finish - r.arrival for r in done),  # type: ignore[operator]
        "decode_s": statistics.mean(r.finish - r.first_token for r in done),  # type: ignore[operator]
        "ttft_mean_s": statistics.mean(ttfts),
        "ttft_p95_s": percentile(ttfts, 95),
        "max_wait_s": max(ttfts),
        "wait_bound_mean_s": sum(b * w for b, w in weighted) / n if n else None,
        "segments": segments,
    }


def p95_floor(mean_s: float, max_wait_s: float) -> float:
    """The smallest p95 a set of waits with this mean and no wait above ``max_wait_s`` can have."""
    return max(0.0, (mean_s - 0.05 * max_wait_s) / 0.95)


def shaped_p95_floor(segments: list[tuple[float, int]], max_wait_s: float) -> float:
    """The smallest p95 of waits whose segments ``(mean at least, requests)`` keep their means, with no
    wait above ``max_wait_s``: what a policy that shaped every wait perfectly could reach.

    A segment of ``n`` requests with mean ``m`` puts the fewest of them above ``T`` by holding the rest at
    ``T`` and those few at ``max_wait_s``: ``k ≥ n·(m − T) / (max_wait_s − T)``. The p95 is at most ``T``
    when the ``k`` of all segments are at most 5% of the requests; that sum falls as ``T`` rises, so the
    smallest such ``T`` is found by bisection."""
    total = sum(n for _, n in segments)
    if total == 0:
        return 0.0

    def over(t: float) -> float:
        return sum(n * max(0.0, (m - t) / (max_wait_s - t)) for m, n in segments)

    low, high = 0.0, max_wait_s
    if over(low) <= 0.05 * total:
        return 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (low, mid) if over(mid) <= 0.05 * total else (mid, high)
    return high
