"""The frontier between throughput and the wait bound (a team's ``max_wait_s``) where the cache cannot hold
the conversations: the ``gateway`` stack at each bound beside ``direct`` and the unbounded-cache ceiling.

    python -m loadtest.analysis.wait_frontier --profile b300-tp8-bf16 --levels 48,64 --seeds 1,2 \\
        --bounds 120,180,240,300,450,600,900

prints a Markdown table (every bound; docs/benchmarks.md, "Bounded waits", shows the rows it discusses).
Each bound is set as the default team's ``max_wait_s`` (the team otherwise unlimited), every other parameter
at its default.
"""

from __future__ import annotations

import argparse
import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

UNLIMITED = {"max_concurrency": 1_000_000, "max_queue": 1_000_000, "queue_timeout_s": 1e9}


def _one(args: tuple[str, int, int, float | None, str]) -> tuple[tuple[str, int, int, float | None], dict]:
    from loadtest.sim.simulate import SimConfig, build_core, run_one

    profile, level, seed, bound, stack = args
    cfg = SimConfig(
        profile=profile,
        conversations=level,
        seed=seed,
        policy="direct" if stack == "direct" else "sglang-cache-aware" if stack == "ceiling" else "gateway",
        unbounded=stack == "ceiling",
    )
    config = None if bound is None else {"teams": {"default": {**UNLIMITED, "max_wait_s": bound}}}
    core = build_core(cfg.policy, config=config)
    return (stack, level, seed, bound), run_one(cfg, core=core)


def run(profile: str, levels: list[int], seeds: list[int], bounds: list[float], jobs: int = 0) -> dict:
    work: list[tuple[str, int, int, float | None, str]] = []
    for level, seed in itertools.product(levels, seeds):
        work += [(profile, level, seed, None, "direct"), (profile, level, seed, None, "ceiling")]
        work += [(profile, level, seed, b, "gateway") for b in bounds]
    with ProcessPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        return dict(pool.map(_one, work))


def _m(x: float) -> str:
    return f"{x / 1e6:.2f}M"


def _s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f} s" if x < 10 else f"{x:.0f} s")


def render(rows: dict[tuple[str, int, int, float | None], Any], levels: list[int], seeds: list[int]) -> str:
    out = [
        "| Conv. | Seed | System | max_wait_s | Tokens/min | × direct | TTFT p50 | TTFT p95 | Longest wait |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for level, seed in itertools.product(levels, seeds):
        direct = rows[("direct", level, seed, None)]
        keys = sorted((k for k in rows if k[1:3] == (level, seed) and k[0] == "gateway"), key=lambda k: k[3] or 0)
        ordered = [("direct", level, seed, None), *keys, ("ceiling", level, seed, None)]
        for key in ordered:
            r = rows[key]
            name = {"direct": "direct", "ceiling": "unbounded ceiling", "gateway": "gateway"}[key[0]]
            bound = "-" if key[3] is None else f"{key[3]:g}"
            out.append(
                f"| {level} | {seed} | {name} | {bound} | {_m(r['total_tpm'])} | "
                f"{r['total_tpm'] / direct['total_tpm']:.2f} | {_s(r['ttft_p50_s'])} | {_s(r['ttft_p95_s'])} | "
                f"{_s(r['max_wait_s'])} |"
            )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="b300-tp8-bf16")
    ap.add_argument("--levels", default="48,64")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--bounds", default="120,180,240,300,450,600,900")
    ap.add_argument("--jobs", type=int, default=0)
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    rows = run(a.profile, levels, seeds, [float(x) for x in a.bounds.split(",")], a.jobs)
    print(render(rows, levels, seeds))


if __name__ == "__main__":
    main()
