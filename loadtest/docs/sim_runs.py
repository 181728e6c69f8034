"""The calibration docs' simulated runs: their protocol, the published figures, running them and reading them back."""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor

LEVELS = (8, 16, 32, 48, 64)
PROFILES = (
    "b300-tp8-bf16",
    "b300-dp2-bf16",
    "b300-tp4-fp8",
    "b300-tp8-fp8-hicache",
    "b300-tp8-fp8-dcp8",
    "b300-dp8-fp8",
    "b300-dp8-fp8-cp",
)
RUNS: dict[str, tuple[str, str | None, int]] = {
    "b300-dp8-fp8-cp": ("gateway", "none", 1),  # rank-pinned min-TTFT routing, no seats: cache-affine, no admission
    "b300-tp4-fp8": ("direct", None, 2),  # --tp 4 --dp 2: two replicas, the DP controller's round robin
}
"""(policy, admission, backends) per profile; the rest run ``direct`` (the server's own scheduling) on one."""
COLLAPSING = ("b300-tp8-bf16", "b300-dp2-bf16", "b300-tp4-fp8")
STEADY = (40.0, 20.0)
"""(minutes, warm-up minutes) of the collapsing profiles' steady-state runs, with ``--warm-start``: the
published runs served mature conversations at every level (about 162k tokens per request, §11), and a run
whose conversations all start at their first turn serves young ones for as long as it is collapsed (they
age one turn per cycle); the warm start enters them at random turns, and 20 minutes absorb the cold
caches' first storm of full recomputes."""
# The published comparison (reference §11): (total tokens/min, median TTFT s, p95 TTFT s).
PUBLISHED = {
    "good": {
        8: (5.14e6, 0.37, 7.12),
        16: (10.90e6, 0.39, 8.01),
        32: (16.79e6, 0.52, 9.58),
        48: (20.23e6, 0.65, 16.00),
        64: (19.19e6, 5.97, 16.89),
    },
    "bad": {
        8: (3.95e6, 2.40, 20.53),
        16: (5.66e6, 3.09, 30.78),
        32: (1.33e6, 51.50, 221.35),
        48: (0.48e6, 110.84, 327.45),
        64: (0.65e6, 159.00, 464.75),
    },
}
PUBLISHED_BAD_RPM = {8: 24.0, 16: 35.0, 32: 8.2, 48: 3.0, 64: 4.0}
"""Completed requests/min of the collapsing deployment (reference §11's analysis: tokens/min / ~162k)."""
COMPARE_WITH = {
    "b300-tp8-bf16": "bad",
    "b300-dp2-bf16": "bad",
    "b300-tp4-fp8": "bad",
    "b300-tp8-fp8-hicache": "good",
    "b300-tp8-fp8-dcp8": "good",
    "b300-dp8-fp8": "good",
    "b300-dp8-fp8-cp": "good",
}


def command(profile: str, minutes: float, warmup: float, steady: bool = False) -> str:
    policy, admission, backends = RUNS.get(profile, ("direct", None, 1))
    pol = policy + (f" --admission {admission}" if admission else "")
    if steady:
        minutes, warmup = STEADY
    return (
        f"cachegate simulate --profile {profile} --backends {backends} --policy {pol} --workload coding-agent "
        f"--conversations {','.join(map(str, LEVELS))} --minutes {minutes:g} --warmup-minutes {warmup:g} "
        + ("--warm-start " if steady else "")
        + f"--seed 1 --json {profile}{'-steady' if steady else ''}.json"
    )


def _run(args: tuple[str, int, float, float, bool]) -> tuple[dict, float]:
    from loadtest.sim.simulate import SimConfig, run_one

    profile, n, minutes, warmup, steady = args
    policy, admission, backends = RUNS.get(profile, ("direct", None, 1))
    t = time.perf_counter()
    row = run_one(
        SimConfig(
            profile=profile,
            conversations=n,
            minutes=minutes,
            warmup_minutes=warmup,
            policy=policy,
            admission=admission,
            backends=backends,
            warm_start=steady,
        )
    )
    return row, time.perf_counter() - t


def run_all(minutes: float, warmup: float, jobs: int) -> tuple[list[dict], dict[str, float]]:
    work = [(p, n, minutes, warmup, False) for p in PROFILES for n in LEVELS]
    work += [(p, n, *STEADY, True) for p in COLLAPSING for n in LEVELS]
    with ProcessPoolExecutor(jobs) as pool:
        results = list(pool.map(_run, work))
    walls = {f"{r['profile']}@{r['conversations']}{' steady' if r.get('warm_start') else ''}": w for r, w in results}
    return [r for r, _ in results], walls


def _m(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}M"


def _s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def _ratio(a: float | None, b: float) -> str:
    return "-" if a is None else f"{a / b:.2f}"


def _at(rows: list[dict], profile: str, n: int, steady: bool = False) -> dict:
    """The run of ``profile`` at ``n`` conversations: the calibration protocol's, or the steady state's."""
    return next(
        r for r in rows if r["profile"] == profile and r["conversations"] == n and bool(r.get("warm_start")) == steady
    )
