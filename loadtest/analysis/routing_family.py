"""The routing comparison on the workload family: ``python -m loadtest.analysis.routing_family``.

Per workload, fleet size and seed: cachegate (``gateway``), SGLang's ``cache_aware`` (its own
defaults), round-robin, least-load, and the unbounded-cache ceiling (``gateway`` with unbounded KV
on every backend): hit rate, TTFT p50/p95, longest wait, tokens/min, busiest/mean, and the issue's
acceptance per row (cachegate's p95 and p50 ≤ 1.05× the best other router's, tokens/min ≥ 0.98×
the best, hit rate ≥ 90% of the ceiling or ≥ the best router's where no router reaches that, no
starved conversation).

Also printed, not judged: cachegate's router alone (``min-ttft``: the ``gateway`` stack with
``--admission none``), which separates what routing does from what the seats do.

Setup (``b300-tp8-fp8``): the generated members and the public trace run open loop on backends of
1M tokens of KV each at ``speedup`` = backends / 8 (the same load per backend at 4 and 8);
``coding-agent`` runs closed loop with 48 conversations per backend on the profile's own KV.
Every run is one process (``--jobs``); ``--json`` keeps the rows, ``--from-json`` prints them again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from loadtest.workloads import FAMILY

PROFILE = "b300-tp8-fp8"
TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
MOONCAKE = "mooncake"
"""The public conversation trace (``trace:`` of ``TRACE``)."""
ROUTERS = ["gateway", "sglang-cache-aware", "round-robin", "least-load"]
CEILING = "ceiling"
ROUTER_ALONE = "min-ttft"
"""cachegate's router without its admission (``--admission none``): informative, not in the verdict."""
TUNING = ["coding-agent", MOONCAKE, *(n for n, m in FAMILY.items() if m.tuning)]
HELD_OUT = [n for n, m in FAMILY.items() if not m.tuning]


def config(workload: str, backends: int, seed: int, policy: str, minutes: float) -> Any:
    from loadtest.sim.simulate import SimConfig

    ceiling = policy == CEILING
    cfg = SimConfig(
        profile=PROFILE,
        backends=backends,
        policy="gateway" if policy in (CEILING, ROUTER_ALONE) else policy,
        admission="none" if policy == ROUTER_ALONE else None,
        minutes=minutes,
        seed=seed,
        unbounded=ceiling,
    )
    if workload == "coding-agent":
        cfg.conversations = 48 * backends
    else:
        cfg.workload = f"trace:{TRACE}" if workload == MOONCAKE else workload
        cfg.speedup = backends / 8
        cfg.kv_tokens = None if ceiling else 1_000_000
    return cfg


def _run(job: tuple[str, int, int, str, float]) -> dict:
    from loadtest.sim.simulate import run_one

    workload, backends, seed, policy, minutes = job
    row = run_one(config(workload, backends, seed, policy, minutes))
    return {"family": workload, "router": policy, "backends": backends, "seed": seed, **row}


def run(
    workloads: Iterable[str],
    backends: Iterable[int],
    seeds: Iterable[int],
    routers: list[str],
    minutes: float,
    jobs: int,
) -> list[dict]:
    todo = [(w, b, s, r, minutes) for w in workloads for b in backends for s in seeds for r in routers]
    if jobs <= 1:
        return [_run(j) for j in todo]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_run, todo))


def verdict(rows: list[dict]) -> dict[str, bool]:
    """The acceptance lines for one (workload, backends, seed) group of rows."""
    by = {r["router"]: r for r in rows}
    me = by.get("gateway")
    others = [by[r] for r in ROUTERS[1:] if r in by]
    out: dict[str, bool] = {}
    if me is None or not others:
        return out
    out["p95"] = me["ttft_p95_s"] <= 1.05 * min(r["ttft_p95_s"] for r in others)
    out["p50"] = me["ttft_p50_s"] <= 1.05 * min(r["ttft_p50_s"] for r in others)
    out["tokens"] = me["total_tpm"] >= 0.98 * max(r["total_tpm"] for r in others)
    hits = [r["cache_hit_rate"] or 0.0 for r in others]
    ceiling = (by[CEILING]["cache_hit_rate"] or 0.0) if CEILING in by else None
    hit = me["cache_hit_rate"] or 0.0
    if ceiling is not None and max([hit, *hits]) >= 0.9 * ceiling:
        out["hit"] = hit >= 0.9 * ceiling
    else:
        out["hit"] = hit >= max(hits)
    out["starved"] = me["starved"] == 0
    return out


HEADER = [
    "Backends",
    "Seed",
    "Router",
    "Hit rate",
    "× ceiling",
    "TTFT p50",
    "TTFT p95",
    "Longest wait",
    "Tokens/min",
    "Busiest / mean",
    "Starved",
]


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f} s" if x < 10 else f"{x:.0f} s"


def table(rows: list[dict]) -> str:
    """One markdown table per workload: every fleet size and seed, a verdict line per group."""
    out: list[str] = []
    for w in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == w]
        held = " (held out)" if w in HELD_OUT else ""
        out += [f"#### {w}{held}", ""]
        out.append(f"| {' | '.join(HEADER)} |")
        out.append("|---" * len(HEADER) + "|")
        verdicts: list[str] = []
        for b in sorted({r["backends"] for r in mine}):
            for s in sorted({r["seed"] for r in mine}):
                group = [r for r in mine if r["backends"] == b and r["seed"] == s]
                by = {r["router"]: r for r in group}
                ceil = by.get(CEILING, {}).get("cache_hit_rate")
                for name in [ROUTERS[0], ROUTER_ALONE, *ROUTERS[1:], CEILING]:
                    r = by.get(name)
                    if r is None:
                        continue
                    hit = r["cache_hit_rate"] or 0.0
                    share = f"{hit / ceil:.2f}" if ceil else "-"
                    label = {CEILING: "unbounded ceiling", ROUTER_ALONE: "min-ttft, no admission"}.get(name, name)
                    cells = [str(b), str(s), label, f"{hit:.1%}", share, _s(r["ttft_p50_s"]), _s(r["ttft_p95_s"])]
                    cells += [_s(r["max_wait_s"]), f"{r['total_tpm'] / 1e6:.2f}M", f"{r['load_imbalance'] or 0:.3f}"]
                    out.append(f"| {' | '.join([*cells, str(r['starved'])])} |")
                v = verdict(group)
                if v:
                    verdicts.append(
                        f"{b}×, seed {s}: " + ", ".join(f"{k} {'PASS' if ok else 'FAIL'}" for k, ok in v.items())
                    )
        out += ["", *(f"- {v}" for v in verdicts), ""]
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """One line per workload: for each (backends, seed), PASS or the acceptance lines that fail."""
    groups = sorted({(r["backends"], r["seed"]) for r in rows})
    out = ["| Workload | " + " | ".join(f"{b} backends, seed {s}" for b, s in groups) + " |"]
    out.append("|---" * (len(groups) + 1) + "|")
    for w in dict.fromkeys(r["family"] for r in rows):
        cells = []
        for b, s in groups:
            v = verdict([r for r in rows if r["family"] == w and r["backends"] == b and r["seed"] == s])
            failed = [k for k, ok in v.items() if not ok]
            cells.append("-" if not v else ("PASS" if not failed else "FAIL: " + ", ".join(failed)))
        held = " (held out)" if w in HELD_OUT else ""
        out.append(f"| {w}{held} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.analysis.routing_family", description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="tuning", help="comma list, or 'tuning', 'held-out', 'all'")
    ap.add_argument("--backends", default="4,8")
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--routers", default=",".join([*ROUTERS, CEILING]))
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the rows here (JSON lines)")
    ap.add_argument("--from-json", type=Path, nargs="*", help="print tables from earlier --json files")
    a = ap.parse_args(argv)
    if a.from_json:
        rows = [orjson.loads(line) for p in a.from_json for line in p.read_bytes().splitlines() if line.strip()]
        print(summary(rows), "", table(rows), sep="\n")
        return
    groups = {"tuning": TUNING, "held-out": HELD_OUT, "all": TUNING + HELD_OUT}
    names = [n for part in a.workloads.split(",") for n in groups.get(part, [part])]
    unknown = [n for n in names if n not in (*TUNING, *HELD_OUT)]
    if unknown:
        sys.exit(f"unknown workload(s): {', '.join(unknown)}")
    rows = run(
        names,
        [int(x) for x in a.backends.split(",")],
        [int(x) for x in a.seeds.split(",")],
        a.routers.split(","),
        a.minutes,
        a.jobs,
    )
    if a.json:
        with a.json.open("ab") as fh:
            for r in rows:
                fh.write(orjson.dumps(r) + b"\n")
    print(summary(rows), "", table(rows), sep="\n")


if __name__ == "__main__":
    main()
