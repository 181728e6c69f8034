"""Regenerate the simulated tables of ``docs/calibration.md`` and ``docs/benchmarks.md``.

    python -m loadtest.docs                      # run the simulations (2 processes), write both docs
    python -m loadtest.docs --runs runs.json     # rewrite the docs from saved runs

Each run is exactly ``cachegate simulate --profile P --backends 1 --policy POLICY --workload
coding-agent --conversations N --minutes 20 --warmup-minutes 5 --seed 1`` with the policy of
``RUNS`` (``direct`` for every profile but the fitted ``b300-dp8-fp8-cp``, which runs rank-pinned
without admission). The published figures are the comparison quoted in
``reference/sglang-and-kimi.md`` §11; only ``b300-dp8-fp8-cp`` is fitted to them
(``loadtest/fit_good.py``).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

LEVELS = (8, 16, 32, 48, 64)
PROFILES = ("b300-tp8-bf16", "b300-dp2-bf16", "b300-tp8-fp8-hicache", "b300-dp8-fp8", "b300-dp8-fp8-cp")
RUNS: dict[str, tuple[str, str | None]] = {
    "b300-dp8-fp8-cp": ("gateway", "none"),  # rank-pinned min-TTFT routing, no seats: cache-affine, no admission
}
"""(policy, admission) per profile; the rest run ``direct`` (the server's own scheduling)."""

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
COMPARE_WITH = {
    "b300-tp8-bf16": "bad",
    "b300-dp2-bf16": "bad",
    "b300-tp8-fp8-hicache": "good",
    "b300-dp8-fp8": "good",
    "b300-dp8-fp8-cp": "good",
}


def command(profile: str, minutes: float, warmup: float) -> str:
    policy, admission = RUNS.get(profile, ("direct", None))
    pol = policy + (f" --admission {admission}" if admission else "")
    return (
        f"cachegate simulate --profile {profile} --backends 1 --policy {pol} --workload coding-agent "
        f"--conversations {','.join(map(str, LEVELS))} --minutes {minutes:g} --warmup-minutes {warmup:g} "
        f"--seed 1 --json {profile}.json"
    )


def _run(args: tuple[str, int, float, float]) -> tuple[dict, float]:
    from loadtest.simulate import SimConfig, run_one

    profile, n, minutes, warmup = args
    policy, admission = RUNS.get(profile, ("direct", None))
    t = time.perf_counter()
    row = run_one(
        SimConfig(
            profile=profile, conversations=n, minutes=minutes, warmup_minutes=warmup, policy=policy, admission=admission
        )
    )
    return row, time.perf_counter() - t


def run_all(minutes: float, warmup: float, jobs: int) -> tuple[list[dict], dict[str, float]]:
    work = [(p, n, minutes, warmup) for p in PROFILES for n in LEVELS]
    with ProcessPoolExecutor(jobs) as pool:
        results = list(pool.map(_run, work))
    walls = {f"{r['profile']}@{r['conversations']}": w for r, w in results}
    return [r for r, _ in results], walls


def _m(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}M"


def _s(x: float | None) -> str:
    return "-" if x is None else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def _ratio(a: float | None, b: float) -> str:
    return "-" if a is None else f"{a / b:.2f}"


def _at(rows: list[dict], profile: str, n: int) -> dict:
    return next(r for r in rows if r["profile"] == profile and r["conversations"] == n)


def calibration_table(rows: list[dict]) -> str:
    head = (
        "| Profile (vs published) | Conv. | TPM sim | TPM pub | ratio | TTFT p50 sim | pub | ratio "
        "| TTFT p95 sim | pub | ratio | cache hit | retractions |"
    )
    lines = [head, "|" + "---|" * 13]
    for profile in PROFILES:
        which = COMPARE_WITH[profile]
        for n in LEVELS:
            r = _at(rows, profile, n)
            tpm, p50, p95 = PUBLISHED[which][n]
            hit = r["cache_hit_rate"]
            lines.append(
                f"| {profile} ({which}) | {n} | {_m(r['total_tpm'])} | {_m(tpm)} | {_ratio(r['total_tpm'], tpm)} "
                f"| {_s(r['ttft_p50_s'])} | {_s(p50)} | {_ratio(r['ttft_p50_s'], p50)} "
                f"| {_s(r['ttft_p95_s'])} | {_s(p95)} | {_ratio(r['ttft_p95_s'], p95)} "
                f"| {'-' if hit is None else f'{hit:.1%}'} | {r['retractions']} |"
            )
    return "\n".join(lines)


def benchmark_table(rows: list[dict], profile: str) -> str:
    which = COMPARE_WITH[profile]
    lines = [
        "| Conv. | TPM sim | TPM published | TTFT p50 sim | published | TTFT p95 sim | published "
        "| req/min | out tok/s p50 | cache hit | max wait s | starved |",
        "|" + "---|" * 12,
    ]
    for n in LEVELS:
        r = _at(rows, profile, n)
        tpm, p50, p95 = PUBLISHED[which][n]
        hit = r["cache_hit_rate"]
        lines.append(
            f"| {n} | {_m(r['total_tpm'])} | {_m(tpm)} | {_s(r['ttft_p50_s'])} | {_s(p50)} "
            f"| {_s(r['ttft_p95_s'])} | {_s(p95)} | {r['completed_rpm']} | {r['output_tps_p50']} "
            f"| {'-' if hit is None else f'{hit:.1%}'} | {_s(r['max_wait_s'])} | {r['starved']} |"
        )
    return "\n".join(lines)


def shape_checks(rows: list[dict]) -> list[tuple[str, bool, str]]:
    """Issue 4's acceptance shapes, evaluated on the measured rows."""
    bf = {n: _at(rows, "b300-tp8-bf16", n)["total_tpm"] for n in LEVELS}
    hc = {n: _at(rows, "b300-tp8-fp8-hicache", n)["total_tpm"] for n in LEVELS}
    peak = max(bf[8], bf[16])
    return [
        (
            "bf16 collapses: TPM at 32 and 48 <= peak(8, 16) / 3",
            bf[32] <= peak / 3 and bf[48] <= peak / 3,
            f"peak {_m(peak)}, 32: {_m(bf[32])} ({bf[32] / peak:.2f}), 48: {_m(bf[48])} ({bf[48] / peak:.2f})",
        ),
        (
            "fp8-hicache does not collapse through 48: TPM(48) >= TPM(16)",
            hc[48] >= hc[16],
            f"16: {_m(hc[16])}, 48: {_m(hc[48])} ({hc[48] / hc[16]:.2f})",
        ),
    ]


def far_off(rows: list[dict]) -> list[str]:
    """Published figures no profile gets within a factor 1.5 of."""
    notes = []
    for which, label in (("good", "good deployment"), ("bad", "bad deployment")):
        for n in LEVELS:
            for k, name in ((0, "TPM"), (1, "TTFT p50"), (2, "TTFT p95")):
                pub = PUBLISHED[which][n][k]
                key = ("total_tpm", "ttft_p50_s", "ttft_p95_s")[k]
                vals = [_at(rows, p, n)[key] for p in PROFILES if _at(rows, p, n)[key] is not None]
                if vals and all(not (pub / 1.5 <= v <= pub * 1.5) for v in vals):
                    notes.append(
                        f"{label} {name} at {n}: published {pub:g}, simulated " + ", ".join(f"{v:.3g}" for v in vals)
                    )
    return notes


def _decode_step(profile, batch: int, ctx_sum: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The engine's decode step (profiles.py formula) and its KV-streaming part, in seconds."""
    cov = 1 - (1 - profile.experts_per_token / profile.num_experts) ** batch
    kv = profile.k_kv * ctx_sum
    return profile.a + profile.t_experts * cov + profile.b * min(batch, profile.b_cap) + kv, kv


def _prefill(profile, u: float, c: float) -> float:  # type: ignore[no-untyped-def]
    return (profile.t0 + u / profile.r_lin + profile.k_attn * u * (c + u / 2)) / profile.prefill_efficiency


def fitted_residuals(rows: list[dict]) -> str:
    """Issue 12's acceptance lines for the fitted ``b300-dp8-fp8-cp``, each with PASS/FAIL."""
    from loadtest.fit_good import LIMITS, residuals

    by_n = {n: _at(rows, "b300-dp8-fp8-cp", n) for n in LEVELS}
    res = residuals(by_n)
    names = {
        "rpm@48": "completed requests/min at 48 (published 125)",
        "tps@32": "median per-request output tokens/s at 32 (published 41)",
        "p50@64": "median TTFT at 64 (published 5.97 s)",
        "p95@64": "p95 TTFT at 64 (published 16.89 s)",
    }
    lines = ["| Figure | Residual (sim / published − 1) | Limit | |", "|---|---|---|---|"]
    for k, lim in LIMITS.items():
        label = names.get(k, f"tokens/min at {k.split('@')[1]}")
        lines.append(f"| {label} | {res[k]:+.1%} | ±{lim:.0%} | {'PASS' if abs(res[k]) <= lim else 'FAIL'} |")
    return "\n".join(lines)


def collapse_lines(rows: list[dict]) -> list[str]:
    out = []
    for profile in ("b300-tp8-bf16", "b300-dp2-bf16"):
        tpm = {n: _at(rows, profile, n)["total_tpm"] for n in LEVELS}
        p50 = {n: _at(rows, profile, n)["ttft_p50_s"] for n in LEVELS}
        peak = max(tpm.values())
        collapse = tpm[48] <= peak / 3
        med = all(pub / 2 <= p50[n] <= pub * 2 for n, pub in ((8, 2.40), (16, 3.09)))
        out.append(
            f"- `{profile}`: tokens/min at 48 {_m(tpm[48])} = {tpm[48] / peak:.2f} of its peak {_m(peak)} "
            f"(collapse ≤ 0.33: {'PASS' if collapse else 'FAIL'}); median TTFT at 8 / 16 "
            f"{_s(p50[8])} / {_s(p50[16])} s against 2.40 / 3.09 (within 2×: {'PASS' if med else 'FAIL'})."
        )
    return out


def gb10_table() -> str:
    from backends.sim.profiles import get_profile
    from loadtest.single import PROMPTS, single_request

    lines = [
        "| Profile | Prefill tok/s (" + " / ".join(f"{p // 1024}k" for p in PROMPTS) + " prompt) | "
        "Decode tok/s (" + " / ".join(f"{p // 1024}k" for p in PROMPTS) + " context) |",
        "|---|---|---|",
    ]
    for name in ("gb10x16-tp16-fp8", "gb10x16-tp4pp4-fp8"):
        r = [single_request(get_profile(name), n) for n in PROMPTS]
        lines.append(
            f"| `{name}` | "
            + " / ".join(f"{x[0]:,.0f}" for x in r)
            + " | "
            + " / ".join(f"{x[1]:.1f}" for x in r)
            + " |"
        )
    lines.append("| published (16×GB10 post, vLLM, K3) | 750 | 20 average, 38 peak |")
    return "\n".join(lines)


def analysis(rows: list[dict]) -> str:
    """Which constant limits what; every number is computed from the profiles and the runs above."""
    from backends.sim.engine import get_profile

    hc, cp = get_profile("b300-tp8-fp8-hicache"), get_profile("b300-dp8-fp8-cp")
    ctx = 150_000  # a typical running context of this workload (median prompt ~151k)
    h48 = _at(rows, "b300-tp8-fp8-hicache", 48)
    step32, kv32 = _decode_step(hc, 32, 32 * ctx)
    pub_step = 1 / 41
    dp_step, dp_kv = _decode_step(cp, 4, 4 * ctx)
    return f"""
## What limits the figures

All numbers below are computed from the profiles' constants (`backends/sim/profiles.py`) and the runs above.

- **TP8 cannot reach the good deployment; DP8 attention can.** Under TP8 every GPU streams the whole
  MLA latent each decode step: with 32 requests decoding at ~150k context the step is {step32 * 1e3:.1f} ms, of
  which {kv32 * 1e3:.1f} ms is the KV stream (`k_kv` = {hc.k_kv * 1e9:.2f} ns per context token); the published
  41 tok/s is a {pub_step * 1e3:.1f} ms step, below the KV stream alone, and `b300-tp8-fp8-hicache` completes
  {h48["completed_rpm"]} req/min at 48 against 125. Under DP8 attention a rank reads only its own requests'
  latents: 4 requests per rank at ~150k is a {dp_step * 1e3:.1f} ms step ({dp_kv * 1e3:.1f} ms of KV), before
  MTP. What DP8 needed to reach the published table is prefill: SGLang's DP defaults (2048-token chunks per rank,
  ratio 0.21), FP8 attention and context-parallel prefill attention (`k_attn` {cp.k_attn:.3g}), and the
  deployment's running cap of {cp.max_running_requests * cp.dp_size} requests, which makes the knee at 64.
- **`b300-dp8-fp8` (derived, SGLang's DP defaults) under `direct`** is the server's own round-robin over 8 ranks
  with separate caches (hits {_at(rows, "b300-dp8-fp8", 48)["cache_hit_rate"]:.1%} at 48) and prefill attention
  on one GPU in bf16: every miss recomputes tens of thousands of tokens at `k_attn` = 3.70e-9.
- **The collapsing deployment.** `b300-tp8-bf16` collapses from 32 on (slow bf16 recompute, 2.63M tokens of KV)
  but serves a cached turn in about 0.3 s at 8-16, where the published medians are 2.40 / 3.09 s: a whole cache
  on one TP8 server has no per-turn misses. `b300-dp2-bf16` (derived: DP2 attention, TP4 per rank, bf16 KV,
  2.6M tokens per rank) names a miss source a single node has: SGLang's DP controller round-robins turns
  over the two ranks, so every turn misses what the other rank computed since its last turn there; its medians
  at 8 / 16 come within 2× of the published. But its two pools (5.2M in all) thrash only partly (LRU keeps each
  conversation's older prefix), so it does not collapse to a third of its peak by 48. Neither profile has both.
"""


def write_docs(
    rows: list[dict],
    walls: dict[str, float] | None,
    minutes: float,
    warmup: float,
    docs: Path,
    notes_calibration: str = "",
    notes_benchmarks: str = "",
) -> None:
    cmds = "\n".join(command(p, minutes, warmup) for p in PROFILES)
    regen = (
        "Regenerate every table on this page (runs in parallel on the available cores):\n\n"
        f"```\npython -m loadtest.docs --minutes {minutes:g} --warmup-minutes {warmup:g}\n```\n\n"
        f"which is the same as\n\n```\n{cmds}\n```\n"
    )
    timing = ""
    if walls:
        slowest = max(walls, key=lambda k: walls[k])
        timing = (
            "\nWall time per simulated run (one core each): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(walls.items()))
            + f". Slowest: {slowest} ({walls[slowest]:.1f} s).\n"
        )
    far = far_off(rows)
    cal = f"""# Calibration: the simulated 8×B300 node against the published comparison

Closed-loop `coding-agent` conversations sent to one simulated SGLang server,
{minutes:g} simulated minutes with the first {warmup:g} excluded, seed 1. Published figures:
`reference/sglang-and-kimi.md` §11 (the collapsing "bad" deployment beside `b300-tp8-bf16` and
`b300-dp2-bf16`, the "good" one beside the others). Ratios are simulated / published. Every profile but one is
derived from hardware figures and SGLang's own settings in `backends/sim/profiles.py`, not fitted to these
curves, and runs `--policy direct` (the server's own scheduling, round-robin over DP ranks).
**`b300-dp8-fp8-cp` is the one fitted profile** (its `fitted` field lists the constants; the script is
`python -m loadtest.fit_good`). It runs rank-pinned without admission (`--policy gateway --admission none`:
min-TTFT routing keeps every conversation on one DP rank and the ranks balanced): the published deployment
had a cache-affine router in front (97% hits are needed for its throughput), and `sglang-cache-aware` with one
worker per rank piles conversations onto a few ranks whose 5-request running cap then queues (p95 34 s at 32
in the fit's first trial), which is not what was measured.

{calibration_table(rows)}

## The fitted profile: residuals (acceptance)

`b300-dp8-fp8-cp`: DP8 attention with fp8 KV, SGLang's DP defaults, FP8 context-parallel prefill attention,
the `kv_b_proj` re-expansion; fitted: U_ATTN, U_LIN, `--max-running-requests` 40 (5 per rank), MTP with one
draft token at accept length 1.3, tokenisation at 1M tokens/s plus 50 ms per request. The grid
(`python -m loadtest.fit_good --search`: U_ATTN 0.6/0.8, U_LIN 0.3/0.45, cap 40/48, MTP off/1.3/1.4) picked
the lowest sum of squared residuals in units of each tolerance, out of 24 candidates: 2.92 for the
registered constants; next U_ATTN 0.8 with MTP 1.3 (2.99) and U_ATTN 0.8 without MTP (3.00, also within
every tolerance, but at 80% of the FP8 peak, which attention kernels do not reach).

{fitted_residuals(rows)}

The p95 at 8-32 stays far below the published 7-10 s: the model has no miss class at low load (the review
estimates about 5% of turns missing would explain it). It is not an acceptance line and is not fitted.

## The collapsing deployment

{chr(10).join(collapse_lines(rows))}

## GB10 (16 × DGX Spark), single request on an idle engine

```
python -m loadtest.single --profiles gb10x16-tp16-fp8,gb10x16-tp4pp4-fp8
```

{gb10_table()}

`gb10x16-tp16-fp8` meets the post within 25% (prefill at 8k-32k prompts, decode 38 at short and ~20 at
128k context). `gb10x16-tp4pp4-fp8` prefills alike but decodes at 12-17 tok/s: one request crosses the four
stages one after another, each with its own launch and all-reduce overhead, so PP4 cannot reach the post's
38 peak at batch 1 (the post's deployment is closer to TP16).

## Engine options and their derivations

Each is a `Profile` field derived in `backends/sim/profiles.py` (module docstring and `_b300`), from SGLang's
source (`srt/arg_groups/parallel_hook.py` `handle_data_parallelism`, `srt/arg_groups/fields/schedule.py`,
`srt/managers/prefill_delayer.py`, `srt/model_executor/pool_configurator.py`):

- DP attention: `chunked_prefill_size // dp_size` (16384 → 2048), `schedule_conservativeness × 0.3` (new-token
  ratio 0.21); the ranks step together (a pass lasts the slowest rank's time).
- FP8 prefill attention: 2× the bf16 peak. Context-parallel prefill attention: `k_attn` / CP group size, and the
  attention of every rank of a group prefilling in the same pass is summed (the group's GPUs are shared).
- `kv_b_proj` re-expansion of the cached prefix per chunk (trtllm_mla `MHA_CHUNKED_KV`): 1.0e9 FLOPs per prefix
  token per chunk at the attention rate, +20% of attention at 2048-token chunks, +2.5% at 16384 (every B300
  profile).
- Speculative decoding (MTP/EAGLE): a verify step carries d + 1 tokens per request, reads the KV once (×1.1),
  pays 0.1·a per draft token and yields the accept length per request. Off except in the fitted profile.
- `max_running_requests` per rank: SGLang's default formula, or the deployment's value // dp_size.
- Per-request overhead (tokenisation and HTTP before the scheduler): off except in the fitted profile.
- Mixed chunk and the prefill delayer (`prefill_delayer_max_delay_passes` 30): modelled, off by default as in
  SGLang.

{regen}{timing}
## Published figures no profile reaches (within a factor 1.5)

{chr(10).join(f"- {x}" for x in far) if far else "- none"}
{analysis(rows)}{notes_calibration}
"""
    checks = shape_checks(rows)
    bench = f"""## Simulated: the collapse without admission control (`--policy direct`, one 8×B300 node)

`coding-agent`, {minutes:g} simulated minutes, first {warmup:g} excluded, seed 1. Published figures from
`reference/sglang-and-kimi.md` §11.

### `b300-tp8-bf16` (beside the published collapsing deployment)

{benchmark_table(rows, "b300-tp8-bf16")}

### `b300-tp8-fp8-hicache` (beside the published good deployment)

{benchmark_table(rows, "b300-tp8-fp8-hicache")}

### Shape checks

{chr(10).join(f"- {'PASS' if ok else 'FAIL'}: {name} ({detail})" for name, ok, detail in checks)}

{regen}{timing}{notes_benchmarks}"""
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "calibration.md").write_text(cal)
    _write_section(docs / "benchmarks.md", bench)


BEGIN, END = "<!-- loadtest.docs:begin (generated by python -m loadtest.docs) -->", "<!-- loadtest.docs:end -->"


def _write_section(path: Path, body: str) -> None:
    """Replace only the generated section of ``path``; other sections (other issues' tables) stay."""
    section = f"{BEGIN}\n{body.rstrip()}\n{END}"
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--warmup-minutes", type=float, default=5.0)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=Path, help='rewrite the docs from this saved {"runs": [...]} file')
    ap.add_argument("--save", type=Path, help="save the runs here")
    ap.add_argument("--docs", type=Path, default=Path("docs"))
    args = ap.parse_args()
    walls = None
    if args.runs:
        rows = orjson.loads(args.runs.read_bytes())["runs"]
    else:
        t = time.perf_counter()
        rows, walls = run_all(args.minutes, args.warmup_minutes, args.jobs)
        print(f"{len(rows)} runs in {time.perf_counter() - t:.0f} s wall")
    if args.save:
        args.save.write_bytes(orjson.dumps({"runs": rows}, option=orjson.OPT_INDENT_2))
    write_docs(rows, walls, args.minutes, args.warmup_minutes, args.docs)
    for name, ok, detail in shape_checks(rows):
        print(f"{'PASS' if ok else 'FAIL'}: {name} ({detail})")


if __name__ == "__main__":
    main()
