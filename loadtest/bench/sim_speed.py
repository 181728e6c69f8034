"""Simulator speed for planning: wall and CPU time of ``gateway`` runs against backends and
conversations (``python -m loadtest.bench.sim_speed``; docs/benchmarks.md has the table).

Every run: ``b300-tp8-fp8-hicache``, ``coding-agent``, 20 simulated minutes (5 of warm-up), seed 1,
one process per run (``--jobs`` at a time). CPU seconds are the run's own process time, so they do
not grow when other work shares the cores; the load average at the start and end is printed too.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor


def _one(args: tuple[int, int, float]) -> dict:
    from loadtest.sim.simulate import SimConfig, run_one

    backends, conversations, minutes = args
    cpu, wall = time.process_time(), time.perf_counter()
    row = run_one(
        SimConfig(
            profile="b300-tp8-fp8-hicache",
            backends=backends,
            policy="gateway",
            conversations=conversations,
            minutes=minutes,
            warmup_minutes=min(5.0, minutes / 4),
        )
    )
    return {
        "backends": backends,
        "conversations": conversations,
        "minutes": minutes,
        "cpu_s": round(time.process_time() - cpu, 1),
        "wall_s": round(time.perf_counter() - wall, 1),
        "requests_per_min": row["completed_rpm"],
        "total_tpm": row["total_tpm"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--grid", default="8x375,16x750,32x1500,64x3000,64x750,64x1500", help="BACKENDSxCONVERSATIONS,...")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    grid = [tuple(int(x) for x in g.split("x")) for g in a.grid.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    work = sorted(((b, n, a.minutes) for b, n in grid), key=lambda w: -w[0] * w[1])
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(_one, work))
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print("| Backends | Conversations | Simulated min | CPU s | Wall s | Requests/min (simulated) |")
    print("|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["backends"], r["conversations"])):
        print(
            f"| {r['backends']} | {r['conversations']} | {r['minutes']:g} | {r['cpu_s']} | {r['wall_s']} | "
            f"{r['requests_per_min']:.0f} |"
        )


if __name__ == "__main__":
    main()
