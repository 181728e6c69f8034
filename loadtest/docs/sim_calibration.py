"""The simulated runs against the published comparison: the calibration tables and their acceptance checks."""

from __future__ import annotations

from loadtest.docs.sim_runs import (
    COLLAPSING,
    COMPARE_WITH,
    LEVELS,
    PROFILES,
    PUBLISHED,
    PUBLISHED_BAD_RPM,
    _at,
    _m,
    _ratio,
    _s,
)


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


def fitted_residuals(rows: list[dict]) -> str:
    """Issue 12's acceptance lines for the fitted ``b300-dp8-fp8-cp``, each with PASS/FAIL."""
    from loadtest.analysis.fit_good import LIMITS, residuals

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


def collapse_check(rows: list[dict], profile: str, steady: bool = True) -> tuple[float, bool, bool]:
    """(tokens/min at 48 over the peak, collapse ≤ a third, medians at 8 / 16 within 2× of 2.40 / 3.09 s)."""
    tpm = {n: _at(rows, profile, n, steady)["total_tpm"] for n in LEVELS}
    p50 = {n: _at(rows, profile, n, steady)["ttft_p50_s"] for n in LEVELS}
    ratio = tpm[48] / max(tpm.values())
    med = all(p50[n] is not None and pub / 2 <= p50[n] <= pub * 2 for n, pub in ((8, 2.40), (16, 3.09)))
    return ratio, ratio <= 1 / 3, med


def collapse_lines(rows: list[dict]) -> list[str]:
    out = []
    for profile in COLLAPSING:
        r = {n: _at(rows, profile, n, True) for n in LEVELS}
        peak = max(x["total_tpm"] for x in r.values())
        ratio, collapse, med = collapse_check(rows, profile)
        fresh = collapse_check(rows, profile, steady=False)[0]
        out.append(
            f"- `{profile}`: tokens/min at 48 {_m(r[48]['total_tpm'])} = {ratio:.2f} of its peak {_m(peak)} "
            f"(collapse ≤ 0.33: {'PASS' if collapse else 'FAIL'}; {fresh:.2f} in the calibration table's "
            f"protocol); median TTFT at 8 / 16 {_s(r[8]['ttft_p50_s'])} / {_s(r[16]['ttft_p50_s'])} s against "
            f"2.40 / 3.09 (within 2×: {'PASS' if med else 'FAIL'})."
        )
    return out


def _hits(rows: list[dict]) -> str:
    """Steady-state hit rates at 8 / 16 of the pair against one TP8 server."""

    def h(p: str) -> str:
        return " / ".join(f"{_at(rows, p, n, True)['cache_hit_rate']:.1%}" for n in (8, 16))

    return f"{h('b300-tp4-fp8')} at 8 / 16 against {h('b300-tp8-bf16')}"


def _per_req(r: dict) -> str:
    rpm = r["completed_rpm"]
    return "-" if not rpm else f"{r['total_tpm'] / rpm / 1e3:.0f}k"


def collapse_residuals(rows: list[dict], profile: str = "b300-tp4-fp8") -> str:
    """The collapsing profile's steady-state figures against the published ones, and its
    tokens per request in both protocols (the published runs' were ~162k at every level)."""
    lines = [
        "| Conv. | TPM sim | pub | ratio | TTFT p50 sim | pub | ratio | TTFT p95 sim | pub | ratio "
        "| req/min sim | pub | tokens/req | pub | 20-min protocol | cache hit |",
        "|" + "---|" * 16,
    ]
    for n in LEVELS:
        r, fresh = _at(rows, profile, n, True), _at(rows, profile, n)
        tpm, p50, p95 = PUBLISHED["bad"][n]
        rpm = PUBLISHED_BAD_RPM[n]
        lines.append(
            f"| {n} | {_m(r['total_tpm'])} | {_m(tpm)} | {_ratio(r['total_tpm'], tpm)} "
            f"| {_s(r['ttft_p50_s'])} | {_s(p50)} | {_ratio(r['ttft_p50_s'], p50)} "
            f"| {_s(r['ttft_p95_s'])} | {_s(p95)} | {_ratio(r['ttft_p95_s'], p95)} "
            f"| {r['completed_rpm']} | {rpm:g} | {_per_req(r)} | {tpm / rpm / 1e3:.0f}k | {_per_req(fresh)} "
            f"| {r['cache_hit_rate']:.1%} |"
        )
    ratio = collapse_check(rows, profile)[0]
    fresh = collapse_check(rows, profile, steady=False)[0]
    lines.append(
        f"\nPeak {_m(max(_at(rows, profile, n, True)['total_tpm'] for n in LEVELS))}; tokens/min at 48 = "
        f"{ratio:.2f} of it in the steady state ({fresh:.2f} in the 20-minute protocol)."
    )
    return "\n".join(lines)
