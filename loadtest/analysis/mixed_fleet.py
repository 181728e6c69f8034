"""A mixed fleet behind one alias: one engine of each profile (``A+B``, e.g. SGLang and vLLM on the same
hardware), against each engine serving its share alone.

    python -m loadtest.analysis.mixed_fleet --profiles gb10x16-tp4pp4-fp8,gb10x16-tp4pp4-fp8-vllm \\
        --levels 8,16,32 --seeds 1,2 --minutes 60 --warmup-minutes 10

For ``N`` conversations on the two-backend fleet (``cachegate simulate --profile A+B --backends 2``): the
``gateway``, ``sglang-cache-aware`` and ``direct`` stacks, and the **partition**: the same ``N``
conversations split in halves, each half served alone by one engine with ``direct`` (slots ``0 … N/2 − 1``
on one, ``N/2 … N − 1`` on the other, ``SimConfig.first_slot``), their tokens/min summed; both ways round,
the better one kept. That is a fleet with no router at all, where each engine serves only its own
conversations: what mixing the engines must at least match. "Starved" is the number of conversation slots
that completed no turn in the measured window.
"""

from __future__ import annotations

import argparse
import itertools
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

STACKS = ("gateway", "sglang-cache-aware", "direct")


def _one(args: tuple[str, int, int, int, str, int, float, float]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    from loadtest.sim.simulate import SimConfig, run_one

    profile, backends, level, first, policy, seed, minutes, warmup = args
    cfg = SimConfig(
        profile=profile, backends=backends, policy=policy, conversations=level, first_slot=first, seed=seed,
        minutes=minutes, warmup_minutes=warmup,
    )  # fmt: skip
    return args, run_one(cfg)


def run(
    profiles: list[str], levels: list[int], seeds: list[int], minutes: float, warmup: float, jobs: int = 0
) -> list[dict[str, Any]]:
    """One row per (level, seed): each stack on the mixed fleet and the partition."""
    a, b = profiles
    work: list[tuple[str, int, int, int, str, int, float, float]] = []
    for level, seed in itertools.product(levels, seeds):
        half = level // 2
        work += [(f"{a}+{b}", 2, level, 0, stack, seed, minutes, warmup) for stack in STACKS]
        work += [(p, 1, half, first, "direct", seed, minutes, warmup) for p in (a, b) for first in (0, half)]
    with ProcessPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        done = dict(pool.map(_one, work))
    rows = []
    for level, seed in itertools.product(levels, seeds):
        half = level // 2
        row: dict[str, Any] = {"level": level, "seed": seed}
        for stack in STACKS:
            row[stack] = done[(f"{a}+{b}", 2, level, 0, stack, seed, minutes, warmup)]
        ways = []
        for first_a in (0, half):  # a serves one half, b the other
            ra = done[(a, 1, half, first_a, "direct", seed, minutes, warmup)]
            rb = done[(b, 1, half, half - first_a, "direct", seed, minutes, warmup)]
            ways.append((ra["total_tpm"] + rb["total_tpm"], ra, rb))
        best = max(ways, key=lambda w: w[0])
        row["partition"] = {
            "total_tpm": best[0],
            "max_wait_s": max(best[1]["max_wait_s"], best[2]["max_wait_s"]),
            "starved": best[1]["starved"] + best[2]["starved"],
        }
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]], profiles: list[str]) -> str:
    out = [
        f"Mixed fleet `{'+'.join(profiles)}` (2 backends) against the partition (each engine alone with half "
        "the conversations, `direct`, the better way round):",
        "",
        "| conv. | seed | stack | tokens/min | × partition | TTFT p50 | TTFT p95 | longest wait | starved |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        part = row["partition"]["total_tpm"]
        for stack in STACKS:
            r = row[stack]
            out.append(
                f"| {row['level']} | {row['seed']} | {stack} | {r['total_tpm'] / 1e3:.1f}k | "
                f"{r['total_tpm'] / part:.3f} | {r['ttft_p50_s']:.2f} s | {r['ttft_p95_s']:.1f} s | "
                f"{r['max_wait_s']:.0f} s | {r['starved']} |"
            )
        p = row["partition"]
        out.append(
            f"| {row['level']} | {row['seed']} | partition | {part / 1e3:.1f}k | 1.000 | – | – | "
            f"{p['max_wait_s']:.0f} s | {p['starved']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="gb10x16-tp4pp4-fp8,gb10x16-tp4pp4-fp8-vllm", help="two profiles, A,B")
    ap.add_argument("--levels", default="8,16,32")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--warmup-minutes", type=float, default=10.0)
    ap.add_argument("--jobs", type=int, default=0)
    args = ap.parse_args(argv)
    profiles = [p.strip() for p in args.profiles.split(",")]
    if len(profiles) != 2:
        ap.error("--profiles: exactly two, A,B")
    levels = [int(x) for x in args.levels.split(",")]
    if any(n < 2 or n % 2 for n in levels):
        ap.error("--levels: even numbers of conversations (half on each engine)")
    seeds = [int(x) for x in args.seeds.split(",")]
    rows = run(profiles, levels, seeds, args.minutes, args.warmup_minutes, args.jobs)
    print(table(rows, profiles))


if __name__ == "__main__":
    main()
