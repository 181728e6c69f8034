"""The exact cache view against the approximate index, in the simulator (issue 37's table).

``python -m loadtest.bench.kv_view [--out FILE.json]`` runs, for seeds 1 and 2: coding-agent on
4 × b300-tp8-fp8 at about 2× and 3× the pooled KV in conversations (276 and 412: 192 conversations need
about 1.4× the four pools, docs/benchmarks.md), the Mooncake trace at 8 × 1M tokens, and a many-tenant
shared-prefix trace (``loadtest/workloads/tenants_trace.py``: 150 tenants, 6k-token prefixes, 12 requests/s,
8 × b300-tp8-fp8 at 250k tokens of KV each, clients sending ``max_tokens`` 1000). Each with
``--cache-view approximate`` and ``precise``, the unbounded ceiling, ``sglang-cache-aware`` and
``direct``; on the tenants also routing alone and the ``gateway`` stack with the one-shot admission options
(``ONE_SHOT``), each under both views; it prints one markdown table
(the one in docs/kv-events.md, "Measured"; its summary in docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from loadtest.sim.simulate import SimConfig, run_one
from loadtest.workloads.tenants_trace import write_tenants_trace

MOONCAKE = Path("/work/shared/traces/mooncake/conversation_trace.jsonl")
CODING_LEVELS = {276: "2×", 412: "3×"}


def _setups(seed: int, tmp: Path) -> list[tuple[str, SimConfig]]:
    out: list[tuple[str, SimConfig]] = []
    for n, label in CODING_LEVELS.items():
        base = SimConfig(profile="b300-tp8-fp8", backends=4, policy="gateway", conversations=n, seed=seed)
        out.append((f"coding-agent {n} ({label} pool), 4 × b300-tp8-fp8", base))
    trace = SimConfig(
        profile="b300-tp8-fp8",
        backends=8,
        policy="gateway",
        workload=f"trace:{MOONCAKE}",
        kv_tokens=1_000_000,
        seed=seed,
    )
    out.append(("Mooncake trace, 8 × 1M tokens", trace))
    tenants = write_tenants_trace(tmp / f"tenants-s{seed}.jsonl", seed=seed, rate=12.0)
    ten = replace(trace, workload=f"trace:{tenants}", kv_tokens=250_000, max_tokens=1000)
    out.append(("150 tenants × 6k prefix, 8 × 250k tokens", ten))
    return out


VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("gateway, approximate", {"cache_view": "approximate"}),
    ("gateway, precise", {"cache_view": "precise"}),
    ("gateway, unbounded KV (ceiling)", {"unbounded": True}),
    ("sglang-cache-aware", {"policy": "sglang-cache-aware"}),
    ("direct", {"policy": "direct"}),
]
TENANT_EXTRA: list[tuple[str, dict[str, Any]]] = [
    ("min-ttft without admission, approximate", {"admission": "none", "cache_view": "approximate"}),
    ("min-ttft without admission, precise", {"admission": "none", "cache_view": "precise"}),
]
ONE_SHOT = "admission:\n  shared_blocks: true\n  release_first_turns: true\n"
"""The admission options for one-shot requests over shared prefixes (docs/benchmarks.md, "Shared prefixes
and one-shot turns"), as a config file's ``admission:`` section."""


def _tenant_extra(tmp: Path) -> list[tuple[str, dict[str, Any]]]:
    """The tenants' extra variants: routing alone, and the gateway with the one-shot admission options."""
    options = tmp / "one-shot.yaml"
    options.write_text(ONE_SHOT)
    return [
        *TENANT_EXTRA,
        ("gateway + one-shot options, approximate", {"config": options, "cache_view": "approximate"}),
        ("gateway + one-shot options, precise", {"config": options, "cache_view": "precise"}),
    ]


def run(seeds: tuple[int, ...], tmp: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    tmp.mkdir(parents=True, exist_ok=True)
    tenant_extra = _tenant_extra(tmp)
    for seed in seeds:
        for setup, base in _setups(seed, tmp):
            variants = VARIANTS + (tenant_extra if "tenants" in setup else [])
            for name, change in variants:
                t0 = time.perf_counter()
                row = run_one(replace(base, **change))
                row.update(setup=setup, variant=name, wall_s=round(time.perf_counter() - t0, 1))
                rows.append(row)
                print(
                    f"{setup} | {name} | seed {seed}: hit {row['cache_hit_rate']:.3f} ({row['wall_s']} s)",
                    file=sys.stderr,
                )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = "| Setup | Seed | Variant | Cache hit | TTFT p50 | TTFT p95 | Tokens/min | Longest wait |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(
            f"| {r['setup']} | {r['seed']} | {r['variant']} | {r['cache_hit_rate']:.1%} | {r['ttft_p50_s']:.2f} s | "
            f"{r['ttft_p95_s']:.2f} s | {r['total_tpm'] / 1e6:.2f}M | {r['max_wait_s']:.1f} s |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tmp", type=Path, default=Path("/tmp/cachegate-kv-view"))
    args = ap.parse_args()
    rows = run(tuple(int(s) for s in args.seeds.split(",")), args.tmp)
    if args.out:
        args.out.write_bytes(orjson.dumps({"runs": rows}, option=orjson.OPT_INDENT_2))
    print(table(rows))


if __name__ == "__main__":
    main()
