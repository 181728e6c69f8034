"""Regenerate the simulated tables of ``docs/calibration.md`` and ``docs/benchmarks.md``.

    python -m loadtest.docs                      # run the simulations (2 processes), write both docs
    python -m loadtest.docs --runs runs.json     # rewrite the docs from saved runs

Each run is exactly ``cachegate simulate --profile P --backends 1 --policy direct --workload
coding-agent --conversations N --minutes 20 --warmup-minutes 5 --seed 1``. The published figures
are the comparison quoted in ``reference/sglang-and-kimi.md`` §11; nothing here is fitted to them.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

LEVELS = (8, 16, 32, 48, 64)
PROFILES = ("b300-tp8-bf16", "b300-tp8-fp8-hicache", "b300-dp8-fp8")

# The published comparison (reference §11): (total tokens/min, median TTFT s, p95 TTFT s).
PUBLISHED = {
    "good": {8: (5.14e6, 0.37, 7.12), 16: (10.90e6, 0.39, 8.01), 32: (16.79e6, 0.52, 9.58),
             48: (20.23e6, 0.65, 16.00), 64: (19.19e6, 5.97, 16.89)},
    "bad": {8: (3.95e6, 2.40, 20.53), 16: (5.66e6, 3.09, 30.78), 32: (1.33e6, 51.50, 221.35),
            48: (0.48e6, 110.84, 327.45), 64: (0.65e6, 159.00, 464.75)},
}
COMPARE_WITH = {"b300-tp8-bf16": "bad", "b300-tp8-fp8-hicache": "good", "b300-dp8-fp8": "good"}


def command(profile: str, minutes: float, warmup: float) -> str:
    return (f"cachegate simulate --profile {profile} --backends 1 --policy direct --workload coding-agent "
            f"--conversations {','.join(map(str, LEVELS))} --minutes {minutes:g} --warmup-minutes {warmup:g} "
            f"--seed 1 --json {profile}.json")


def _run(args: tuple[str, int, float, float]) -> tuple[dict, float]:
    from loadtest.simulate import SimConfig, run_one

    profile, n, minutes, warmup = args
    t = time.perf_counter()
    row = run_one(SimConfig(profile=profile, conversations=n, minutes=minutes, warmup_minutes=warmup))
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
    head = ("| Profile (vs published) | Conv. | TPM sim | TPM pub | ratio | TTFT p50 sim | pub | ratio "
            "| TTFT p95 sim | pub | ratio | cache hit | retractions |")
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
                f"| {'-' if hit is None else f'{hit:.1%}'} | {r['retractions']} |")
    return "\n".join(lines)


def benchmark_table(rows: list[dict], profile: str) -> str:
    which = COMPARE_WITH[profile]
    lines = ["| Conv. | TPM sim | TPM published | TTFT p50 sim | published | TTFT p95 sim | published "
             "| req/min | out tok/s p50 | cache hit | max wait s | starved |", "|" + "---|" * 12]
    for n in LEVELS:
        r = _at(rows, profile, n)
        tpm, p50, p95 = PUBLISHED[which][n]
        hit = r["cache_hit_rate"]
        lines.append(f"| {n} | {_m(r['total_tpm'])} | {_m(tpm)} | {_s(r['ttft_p50_s'])} | {_s(p50)} "
                     f"| {_s(r['ttft_p95_s'])} | {_s(p95)} | {r['completed_rpm']} | {r['output_tps_p50']} "
                     f"| {'-' if hit is None else f'{hit:.1%}'} | {_s(r['max_wait_s'])} | {r['starved']} |")
    return "\n".join(lines)


def shape_checks(rows: list[dict]) -> list[tuple[str, bool, str]]:
    """Issue 4's acceptance shapes, evaluated on the measured rows."""
    bf = {n: _at(rows, "b300-tp8-bf16", n)["total_tpm"] for n in LEVELS}
    hc = {n: _at(rows, "b300-tp8-fp8-hicache", n)["total_tpm"] for n in LEVELS}
    peak = max(bf[8], bf[16])
    return [
        ("bf16 collapses: TPM at 32 and 48 <= peak(8, 16) / 3",
         bf[32] <= peak / 3 and bf[48] <= peak / 3,
         f"peak {_m(peak)}, 32: {_m(bf[32])} ({bf[32] / peak:.2f}), 48: {_m(bf[48])} ({bf[48] / peak:.2f})"),
        ("fp8-hicache does not collapse through 48: TPM(48) >= TPM(16)", hc[48] >= hc[16],
         f"16: {_m(hc[16])}, 48: {_m(hc[48])} ({hc[48] / hc[16]:.2f})"),
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
                    notes.append(f"{label} {name} at {n}: published {pub:g}, simulated "
                                 + ", ".join(f"{v:.3g}" for v in vals))
    return notes


def _decode_step(profile, batch: int, ctx_sum: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The engine's decode step (profiles.py formula) and its KV-streaming part, in seconds."""
    cov = 1 - (1 - profile.experts_per_token / profile.num_experts) ** batch
    kv = profile.k_kv * ctx_sum
    return profile.a + profile.t_experts * cov + profile.b * min(batch, profile.b_cap) + kv, kv


def _prefill(profile, u: float, c: float) -> float:  # type: ignore[no-untyped-def]
    return (profile.t0 + u / profile.r_lin + profile.k_attn * u * (c + u / 2)) / profile.prefill_efficiency


def analysis(rows: list[dict]) -> str:
    """Which physical constant limits the figures no profile reaches; every number is computed."""
    from backends.sim.engine import get_profile

    hc, bf = get_profile("b300-tp8-fp8-hicache"), get_profile("b300-tp8-bf16")
    ctx = 150_000  # a typical running context of this workload (median prompt ~151k)
    h32, h48 = _at(rows, "b300-tp8-fp8-hicache", 32), _at(rows, "b300-tp8-fp8-hicache", 48)
    step32, kv32 = _decode_step(hc, 32, 32 * ctx)
    pub_step = 1 / 41
    b8, b48 = _at(rows, "b300-tp8-bf16", 8), _at(rows, "b300-tp8-bf16", 48)
    turn = _prefill(bf, 4_000, ctx)
    full = _prefill(bf, 160_000, 0)
    sim_rate = b48["input_tpm"] * (1 - (b48["cache_hit_rate"] or 0)) / 60
    return f"""
## What limits the figures the model does not reach

All numbers below are computed from the profiles' constants (`backends/sim/profiles.py`) and the runs above.

- **The good deployment's 10.9-20.2M tokens/min (16-64 conversations) is decode-bound in the model, limited
  by HBM bandwidth.** `b300-tp8-fp8-hicache` keeps {h48['cache_hit_rate']:.1%} cache hits at 48, so prefill
  is not the bottleneck; each turn's answer is. A decode step is `a + t_experts·coverage(B) + b·B +
  k_kv·Σctx`; with 32 requests decoding at ~150k context it is {step32 * 1e3:.1f} ms, of which
  {kv32 * 1e3:.1f} ms is streaming the KV cache (`k_kv` = {hc.k_kv * 1e9:.2f} ns per context token = 35,136 B
  of fp8 latents / (8 TB/s × U_BW)) and {hc.t_experts * 1e3:.1f} ms × coverage the routed experts. The published
  41 tok/s per request at 32 conversations is a {pub_step * 1e3:.1f} ms step: below the KV streaming time
  alone unless far fewer requests decode at once or the contexts are much shorter. Measured median output
  speed: {h32['output_tps_p50']} tok/s at 32, {h48['output_tps_p50']} at 48, so turns take longer and fewer
  complete ({h48['completed_rpm']} req/min at 48 vs 125 published). The limiting constant is the HBM
  bandwidth per KV byte (`k_kv`), then the expert-weight stream (`t_experts`).
- **The bad deployment's TTFT below capacity (2.40 s / 3.09 s median at 8 / 16) is {2.40 / b8['ttft_p50_s']:.1f}× the
  model's at 8.** The
  model serves a cached turn (4k new tokens on ~150k cached) in {turn:.2f} s of prefill and has
  {b8['cache_hit_rate']:.1%} hits at 8 conversations; the published figure implies a much slower prefill or
  misses even below capacity. Every B300 profile uses `prefill_efficiency` 1.0 and U_ATTN for `k_attn` =
  {bf.k_attn:.3g} s per token·context (the reference's suggested 0.6 efficiency for that deployment is not
  applied, by design): the limiting constant is the attention FLOP rate (`k_attn`).
- **The bad deployment's deep-collapse throughput (0.48M / 0.65M at 48 / 64) is {0.48e6 / b48['total_tpm']:.2f}× the
  model's at 48.** In the
  all-recompute regime the model recomputes {sim_rate:,.0f} uncached tokens/s at 48 conversations (a cold
  160k prompt takes {full:.1f} s: `t0 + u/r_lin + k_attn·u²/2`, {160_000 / full:,.0f} tok/s); the published
  0.48M tokens/min is {0.48e6 / 60:,.0f} tok/s of all input and output, {0.48e6 / 60 / sim_rate:.2f}× the
  model's recompute rate: the limiting constant is again `k_attn` (attention FLOP/s × U_ATTN).
- `b300-dp8-fp8` under `direct` is not the published good deployment: the server's own round-robin scatters
  each conversation over 8 ranks with separate caches, so a turn often lands on a rank that never saw its
  history (cache hits {_at(rows, 'b300-dp8-fp8', 48)['cache_hit_rate']:.1%} at 48). It is here as the baseline
  that rank pinning (issue 6) is measured against.
"""


def write_docs(rows: list[dict], walls: dict[str, float] | None, minutes: float, warmup: float,
               docs: Path, notes_calibration: str = "", notes_benchmarks: str = "") -> None:
    cmds = "\n".join(command(p, minutes, warmup) for p in PROFILES)
    regen = ("Regenerate every table on this page (runs in parallel on the available cores):\n\n"
             f"```\npython -m loadtest.docs --minutes {minutes:g} --warmup-minutes {warmup:g}\n```\n\n"
             f"which is the same as\n\n```\n{cmds}\n```\n")
    timing = ""
    if walls:
        slowest = max(walls, key=lambda k: walls[k])
        timing = ("\nWall time per simulated run (one core each): "
                  + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(walls.items()))
                  + f". Slowest: {slowest} ({walls[slowest]:.1f} s).\n")
    far = far_off(rows)
    cal = f"""# Calibration: the simulated 8×B300 node against the published comparison

Closed-loop `coding-agent` conversations (interfaces §7) sent straight to one simulated SGLang server
(`--policy direct`), {minutes:g} simulated minutes with the first {warmup:g} excluded. Published figures:
`reference/sglang-and-kimi.md` §11 (the collapsing "bad" deployment beside `b300-tp8-bf16`, the "good" one
beside `b300-tp8-fp8-hicache` and `b300-dp8-fp8`). Ratios are simulated / published. The profiles'
constants are derived from hardware figures in `backends/sim/profiles.py`, not fitted to these curves.

{calibration_table(rows)}

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

### Shape checks (issue 4)

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
    ap.add_argument("--runs", type=Path, help="rewrite the docs from this saved {\"runs\": [...]} file")
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
