"""Virtual-time runs of the full-scale profiles beside the published comparison (for the demo report).

Two deployments of one 8×B300 node, each simulated with ``direct`` (no gateway) and ``gateway``
(cachegate's stack) at the published concurrency levels:

- ``b300-tp8-bf16``: the node that collapses, beside the published "bad" deployment;
- the good deployment's engine profile, ``b300-dp8-fp8-cp`` (fitted to the published good
  deployment) when this build has it, else ``b300-tp8-fp8-hicache``; ``good_profile()`` says which.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import orjson

from loadtest.docs.sim_tables import LEVELS, PUBLISHED

BAD_PROFILE = "b300-tp8-bf16"
GOOD_PROFILES = ("b300-dp8-fp8-cp", "b300-tp8-fp8-hicache")
"""The good deployment's engine profile, first one this build registers."""
POLICIES = ("direct", "gateway")


def good_profile() -> tuple[str, bool]:
    """(profile name, True when it is the fallback rather than the fitted good deployment)."""
    from backends.sim.profiles import PROFILES

    for i, name in enumerate(GOOD_PROFILES):
        if name in PROFILES:
            return name, i > 0
    raise ValueError(f"none of {', '.join(GOOD_PROFILES)} is registered")


def published(which: str) -> dict[str, list[float]]:
    """The published points of the "good" or "bad" deployment: levels, tokens/min, TTFT p50, p95."""
    pts = PUBLISHED[which]
    levels = sorted(pts)
    return {
        "conversations": [float(n) for n in levels],
        "total_tpm": [pts[n][0] for n in levels],
        "ttft_p50_s": [pts[n][1] for n in levels],
        "ttft_p95_s": [pts[n][2] for n in levels],
    }


def _nice() -> None:
    os.nice(10)  # the live sweep runs at the same time: it goes first


def code_key(work: list) -> str:
    """A hash of the code the figures depend on and of the runs asked for: equal keys, equal figures."""
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256(repr(work).encode())
    for pattern in (
        "backends/sim/*.py",
        "policies/**/*.py",
        "loadtest/sim/*.py",
        "loadtest/workloads/core.py",
        "loadtest/results/metrics.py",
    ):
        for f in sorted(root.glob(pattern)):
            h.update(f.read_bytes())
    return h.hexdigest()


def _run(args: tuple[str, str, int, float, float, int]) -> tuple[dict, float]:
    from loadtest.sim.simulate import SimConfig, run_one

    profile, policy, n, minutes, warmup, seed = args
    t = time.process_time()
    row = run_one(
        SimConfig(profile=profile, policy=policy, conversations=n, minutes=minutes, warmup_minutes=warmup, seed=seed)
    )
    return row, time.process_time() - t


class FullScale:
    """The runs, started in a low-priority process pool; ``result()`` waits for them."""

    def __init__(
        self,
        minutes: float = 15.0,
        warmup: float = 5.0,
        seed: int = 1,
        jobs: int = 2,
        levels: tuple[int, ...] = LEVELS,
        cache: Path | None = None,
    ) -> None:
        self.good, self.fallback = good_profile()
        self.minutes, self.warmup, self.seed = minutes, warmup, seed
        self.work = [
            (p, pol, n, float(minutes), float(warmup), seed)
            for p in (BAD_PROFILE, self.good)
            for pol in POLICIES
            for n in levels
        ]
        self.t0 = time.perf_counter()
        self.cache = cache
        self.key = code_key(self.work)
        self.cached: dict | None = None
        if cache is not None and cache.is_file():
            with contextlib.suppress(ValueError, KeyError):
                data = orjson.loads(cache.read_bytes())
                if data["key"] == self.key:
                    self.cached = data["result"]
        self._pool: ProcessPoolExecutor | None = None
        self._futures: list[Future] = []
        if self.cached is None:
            self._pool = ProcessPoolExecutor(max(1, jobs), initializer=_nice)
            self._futures = [self._pool.submit(_run, w) for w in self.work]

    def done(self) -> int:
        return len(self.work) if self.cached is not None else sum(1 for f in self._futures if f.done())

    def result(self) -> dict:
        if self.cached is not None:
            return {**self.cached, "cached": True}
        assert self._pool is not None
        try:
            done = [f.result() for f in self._futures]
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
        out = self._result(done)
        if self.cache is not None:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            self.cache.write_bytes(orjson.dumps({"key": self.key, "result": out}))
        return out

    def _result(self, done: list[tuple[dict, float]]) -> dict:
        return {
            "bad_profile": BAD_PROFILE,
            "good_profile": self.good,
            "good_is_fallback": self.fallback,
            "minutes": self.minutes,
            "warmup_minutes": self.warmup,
            "seed": self.seed,
            "wall_s": round(time.perf_counter() - self.t0, 1),
            "cpu_s": round(sum(w for _, w in done), 1),
            "runs": [row for row, _ in done],
            "published": {"bad": published("bad"), "good": published("good")},
            "command": command(self.good, self.minutes, self.warmup, self.seed),
        }

    def cancel(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def command(good: str, minutes: float, warmup: float, seed: int) -> str:
    levels = ",".join(map(str, LEVELS))
    return "\n".join(
        f"cachegate simulate --profile {p} --backends 1 --policy {pol} --conversations {levels} "
        f"--minutes {minutes:g} --warmup-minutes {warmup:g} --seed {seed}"
        for p in (BAD_PROFILE, good)
        for pol in POLICIES
    )
