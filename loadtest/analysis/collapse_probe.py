"""Where a collapsing profile's time and misses go: the figures behind the collapse analysis of
``docs/calibration.md``.

    python -m loadtest.analysis.collapse_probe --profile b300-tp4-fp8 --backends 2 --conversations 16,48 --seed 1

For each level (``--policy direct``, ``coding-agent``, the window after warm-up): the share of engine
time in prefill and decode passes, the share of prompt tokens computed rather than served from the
cache, retractions, and the turns split by whether the conversation's previous turn went to the same
backend (the miss source of round robin over replicas) and by hit class (cached / prompt below 0.5,
0.5-0.9, above 0.9), with their median TTFT; per backend, its busy and prefill share of the window and
its time-weighted running and waiting requests, KV locked by live requests and evictable cache.
``--warm-start`` enters the conversations at random turns (the steady state of ``docs/calibration.md``'s
collapse section: ``--minutes 40 --warmup-minutes 20 --warm-start``).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from typing import Any

from backends.sim.engine import Engine, get_profile
from loadtest.results.metrics import RequestRecord
from loadtest.sim.simulate import SimConfig, Simulator, build_core
from loadtest.workloads.spec import make_workload


class _TimedEngine(Engine):
    """An engine that adds up its passes' durations by kind, and the time-weighted state of its rank
    (running, waiting, KV locked by live requests, evictable cache), over the passes that start in the
    window. Counted at the pass start: ``complete()`` also runs for arrivals and events mid-pass."""

    def __init__(self, *args: Any, warm: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.warm = warm
        self.pass_time: dict[str, float] = {"prefill": 0.0, "decode": 0.0, "mixed": 0.0}
        self.state_time: dict[str, float] = {"running": 0.0, "waiting": 0.0, "locked": 0.0, "evictable": 0.0}
        self.window_counters: tuple[int, int, int] | None = None

    def _start_pass(self, now: float) -> None:
        super()._start_pass(now)
        if self._pass_end is None or now < self.warm:
            return
        if self.window_counters is None:
            c = self.counters
            self.window_counters = (c.prefill_compute_tokens, c.prefill_cache_tokens, c.retractions)
        dur = self._pass_end - now
        seen: set[str] = set()
        for rk in self._ranks:  # a pass lasts as long as its slowest rank: count it once per kind
            if rk.work is not None and rk.work[0] not in seen:
                seen.add(rk.work[0])
                self.pass_time[rk.work[0]] += rk.work[2]
        rk = self._ranks[0]  # the state of the first rank (the only one of a replica without DP attention)
        cache = rk.cache
        st = self.state_time
        st["running"] += len(rk.running) * dur
        st["waiting"] += len(rk.waiting) * dur
        st["locked"] += (cache.gpu_tokens - cache.evictable_tokens) * dur
        st["evictable"] += cache.evictable_tokens * dur


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def probe(
    profile: str,
    backends: int,
    conversations: int,
    seed: int,
    minutes: float,
    warmup: float,
    warm_start: bool = False,
) -> dict[str, Any]:
    cfg = SimConfig(
        profile=profile,
        backends=backends,
        conversations=conversations,
        seed=seed,
        minutes=minutes,
        warmup_minutes=warmup,
        warm_start=warm_start,
    )
    p = get_profile(profile)
    warm = warmup * 60.0
    engines = {f"b{i}": _TimedEngine(p, warm=warm) for i in range(backends)}
    workload = make_workload("coding-agent", seed=seed, warm_start=warm_start)
    sim = Simulator(cfg, build_core("direct"), dict(engines), workload)
    records = sim.run()
    busy = {k: sum(e.pass_time[k] for e in engines.values()) for k in ("prefill", "decode", "mixed")}
    total = sum(busy.values()) or 1.0
    computed = cached = retractions = 0
    for e in engines.values():
        c0 = e.window_counters or (0, 0, 0)
        computed += e.counters.prefill_compute_tokens - c0[0]
        cached += e.counters.prefill_cache_tokens - c0[1]
        retractions += e.counters.retractions - c0[2]
    served = [r for r in records if r.arrival >= sim.warm and r.first_token is not None and r.first_token < sim.end]
    window = {id(r) for r in served}
    by_slot: dict[int | None, list[RequestRecord]] = {}
    for r in sorted(records, key=lambda r: r.arrival):
        by_slot.setdefault(r.slot, []).append(r)
    switch: dict[str, list[tuple[float, float]]] = {"same": [], "switched": []}
    for turns in by_slot.values():
        for prev, cur in itertools.pairwise(turns):
            if id(cur) not in window or cur.prompt_tokens < prev.prompt_tokens:
                continue  # outside the window, or the first turn of a new conversation
            assert cur.first_token is not None
            key = "same" if prev.backend == cur.backend else "switched"
            switch[key].append((cur.cached_tokens / cur.prompt_tokens, cur.first_token - cur.arrival))
    classes: dict[str, list[float]] = {"<0.5": [], "0.5-0.9": [], ">0.9": []}
    for r in served:
        assert r.first_token is not None
        hit = r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 1.0
        key = "<0.5" if hit < 0.5 else ("0.5-0.9" if hit <= 0.9 else ">0.9")
        classes[key].append(r.first_token - r.arrival)
    span = max(1e-9, (minutes - warmup) * 60.0)
    per_backend = {
        name: {
            "busy_share": round(sum(e.pass_time.values()) / span, 3),
            "prefill_share": round((e.pass_time["prefill"] + e.pass_time["mixed"]) / span, 3),
        }
        | {k: round(v / span, 1) for k, v in e.state_time.items()}
        for name, e in engines.items()
    }
    return {
        "conversations": conversations,
        "prefill_time_share": round((busy["prefill"] + busy["mixed"]) / total, 3),
        "computed_share": round(computed / max(1, computed + cached), 3),
        "retractions": retractions,
        "turns": len(served),
        "switch": {
            k: {"turns": len(v), "hit_mean": round(statistics.fmean(h for h, _ in v), 2) if v else None}
            | {"ttft_p50_s": _median([t for _, t in v])}
            for k, v in switch.items()
        },
        "hit_classes": {k: {"turns": len(v), "ttft_p50_s": _median(v)} for k, v in classes.items()},
        "backends": per_backend,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="b300-tp4-fp8")
    ap.add_argument("--backends", type=int, default=2)
    ap.add_argument("--conversations", default="16,48")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--warmup-minutes", type=float, default=5.0)
    ap.add_argument("--warm-start", action="store_true", help="conversations entered at random turns")
    a = ap.parse_args()
    for n in (int(x) for x in a.conversations.split(",")):
        row = probe(a.profile, a.backends, n, a.seed, a.minutes, a.warmup_minutes, a.warm_start)
        sw, hc = row["switch"], row["hit_classes"]
        print(
            f"{a.profile} x{a.backends} seed {a.seed} @{n}: prefill {row['prefill_time_share']:.0%} of engine time, "
            f"{row['computed_share']:.0%} of prompt tokens computed, {row['retractions']} retractions; "
            f"previous turn on the same backend: {sw['same']['turns']} turns, hit {sw['same']['hit_mean']}, "
            f"TTFT p50 {sw['same']['ttft_p50_s']} s; on the other: {sw['switched']['turns']} turns, "
            f"hit {sw['switched']['hit_mean']}, TTFT p50 {sw['switched']['ttft_p50_s']} s; by hit class "
            + ", ".join(f"{k}: {v['turns']} turns p50 {v['ttft_p50_s']} s" for k, v in hc.items())
        )
        for name, b in row["backends"].items():
            print(
                f"  {name}: busy {b['busy_share']:.0%} of the window ({b['prefill_share']:.0%} in prefill), "
                f"time-weighted {b['running']} running, {b['waiting']} waiting, {b['locked'] / 1e6:.2f}M tokens "
                f"locked, {b['evictable'] / 1e6:.2f}M evictable"
            )


if __name__ == "__main__":
    main()
