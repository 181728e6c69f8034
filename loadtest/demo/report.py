"""The demo's verdict and its report: live sweep and full-scale virtual-time runs side by side.

``verdict(rows)`` reads the live rows: at the top level (the one that oversubscribes the caches)
it compares each system with its own peak and the two systems with each other, and says so in one
sentence. ``write_demo_report`` writes ``report.json``, PNG plots (matplotlib, Agg) and an
``index.html`` that uses nothing but the files beside it, so it opens offline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

import orjson

from loadtest.results.tables import COLUMNS, PLOTS, _cells, fmt_s, fmt_tpm, pyplot, system_of, write_plots

COLORS = {"direct": "#d1495b", "gateway": "#00798c", "sglang-router": "#edae49"}
PUBLISHED_STYLE = {"color": "#333333", "marker": "D", "markerfacecolor": "none", "linestyle": ":", "linewidth": 1}


def _by(rows: Sequence[dict], system: str) -> dict[int, dict]:
    return {int(r["conversations"]): r for r in rows if system_of(r) == system and r.get("conversations")}


def verdict(rows: Sequence[dict]) -> dict | None:
    """The headline at the top level both ``direct`` and ``gateway`` ran, with the acceptance checks."""
    d, g = _by(rows, "direct"), _by(rows, "gateway")
    common = sorted(set(d) & set(g))
    if not common:
        return None
    n = common[-1]
    peak_d = max(r.get("total_tpm") or 0 for r in d.values())
    peak_g = max(r.get("total_tpm") or 0 for r in g.values())
    dt, gt = d[n].get("total_tpm") or 0, g[n].get("total_tpm") or 0
    dp, gp = d[n].get("ttft_p50_s"), g[n].get("ttft_p50_s")
    ratio = gt / dt if dt else None
    ttft_ratio = dp / gp if dp and gp else None
    sentence = (
        (
            f"At {n} conversations, more than the caches hold, going straight to the servers collapses to "
            f"{fmt_tpm(dt)} tokens/min ({dt / peak_d:.0%} of its peak) while cachegate serves {fmt_tpm(gt)} "
            f"({gt / peak_g:.0%} of its peak): {_x(ratio)} the throughput, with a median time to first token of "
            f"{fmt_s(gp)} instead of {fmt_s(dp)}."
        )
        if peak_d and peak_g
        else "No completed requests."
    )
    return {
        "conversations": n,
        "sentence": sentence,
        "tpm_ratio": None if ratio is None else round(ratio, 2),
        "ttft_ratio": None if ttft_ratio is None else round(ttft_ratio, 1),
        "direct": {
            "tpm": dt,
            "peak_tpm": peak_d,
            "of_peak": round(dt / peak_d, 3) if peak_d else None,
            "ttft_p50_s": dp,
        },
        "gateway": {
            "tpm": gt,
            "peak_tpm": peak_g,
            "of_peak": round(gt / peak_g, 3) if peak_g else None,
            "ttft_p50_s": gp,
            "max_wait_s": g[n].get("max_wait_s"),
        },
        "checks": {
            "direct_at_most_half_of_peak": bool(peak_d and dt <= 0.5 * peak_d),
            "gateway_keeps_85pct_of_peak": bool(peak_g and gt >= 0.85 * peak_g),
            "gateway_ttft_p50_at_most_a_fifth": bool(dp and gp is not None and gp <= dp / 5),
        },
    }


# -- plots ---------------------------------------------------------------------------------------


def _series(rows: Sequence[dict], system: str, key: str) -> tuple[list[int], list[float]]:
    pts = sorted((n, r[key]) for n, r in _by(rows, system).items() if r.get(key) is not None)
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def _systems(rows: Sequence[dict]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if system_of(r) not in seen:
            seen.append(system_of(r))
    return seen


def _panel_pair(
    rows: Sequence[dict],
    path: Path,
    title: str,
    published: dict | None = None,
    published_label: str = "",
    hit: bool = False,
) -> Path:
    """Tokens/min and TTFT (p50 solid, p95 dashed, log scale) against conversations [+ cache hit]."""
    plt = pyplot()
    ncols = 3 if hit else 2
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 3.9))
    tpm_ax, ttft_ax = axes[0], axes[1]
    for s in _systems(rows):
        c = COLORS.get(s)
        xs, ys = _series(rows, s, "total_tpm")
        tpm_ax.plot(xs, [y / 1e6 for y in ys], marker="o", color=c, linewidth=2.2, label=s)
        for key, style, mk in (("ttft_p50_s", "-", "o"), ("ttft_p95_s", "--", "^")):
            xs, ys = _series(rows, s, key)
            ttft_ax.plot(
                xs,
                ys,
                linestyle=style,
                marker=mk,
                color=c,
                linewidth=2 if style == "-" else 1.3,
                label=f"{s} {key[5:8]}",
            )
        if hit:
            xs, ys = _series(rows, s, "cache_hit_rate")
            axes[2].plot(xs, [100 * y for y in ys], marker="o", color=c, linewidth=2.2, label=s)
    if published:
        tpm_ax.plot(
            published["conversations"],
            [y / 1e6 for y in published["total_tpm"]],
            label=published_label,
            **PUBLISHED_STYLE,
        )
        ttft_ax.plot(
            published["conversations"], published["ttft_p50_s"], label=f"{published_label} p50", **PUBLISHED_STYLE
        )
        ttft_ax.plot(
            published["conversations"],
            published["ttft_p95_s"],
            label=f"{published_label} p95",
            **{**PUBLISHED_STYLE, "marker": "s", "linestyle": "-."},
        )
    tpm_ax.set(xlabel="concurrent conversations", ylabel="total tokens / min (M)", title="Throughput")
    tpm_ax.set_ylim(bottom=0)
    ttft_ax.set_yscale("log")
    lo, hi = ttft_ax.get_ylim()
    ttft_ax.set_ylim(lo, hi * 6)  # room for the legend above the curves
    ttft_ax.set(xlabel="concurrent conversations", ylabel="seconds (log)", title="Time to first token")
    if hit:
        axes[2].set(xlabel="concurrent conversations", ylabel="%", title="Prompt tokens served from cache")
        axes[2].set_ylim(0, 100)
    for ax, loc in zip(axes, ("best", "upper left", "lower left"), strict=False):
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(fontsize=7.5, frameon=False, loc=loc, ncol=2 if ax is ttft_ax else 1)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- the page ------------------------------------------------------------------------------------


def _table(rows: Sequence[dict]) -> str:
    head = "<tr><th>Conv.</th><th>System</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "</tr>"
    body = []
    for n in sorted({int(r.get("conversations") or 0) for r in rows}):
        for r in rows:
            if int(r.get("conversations") or 0) == n:
                s = system_of(r)
                body.append(
                    f'<tr class="{html.escape(s)}"><td>{n}</td><td>{html.escape(s)}</td>'
                    + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r))
                    + "</tr>"
                )
    return f"<table>{head}{''.join(body)}</table>"


def meaning(v: dict | None, fullscale: dict | None) -> str:
    """The "what this means" paragraph, from the numbers."""
    parts = []
    if v is not None and v["direct"]["of_peak"] is not None and v["gateway"]["of_peak"] is not None:
        parts.append(
            f"On this machine, with {v['conversations']} conversations, more than the twins' caches hold, "
            f"sending every turn straight to the servers leaves {v['direct']['of_peak']:.0%} of the throughput "
            f"they had at their best, because each turn lands where its context was evicted and recomputes it; "
            f"through cachegate the same servers keep {v['gateway']['of_peak']:.0%} of their best, because "
            f"conversations stay where their prefix is and the ones that do not fit wait at the gateway "
            f"(longest wait {fmt_s(v['gateway']['max_wait_s'])}) instead of evicting the others."
        )
    if fullscale:
        runs = fullscale["runs"]
        bad = {(r["policy"], r["conversations"]): r for r in runs if r["profile"] == fullscale["bad_profile"]}
        good = {(r["policy"], r["conversations"]): r for r in runs if r["profile"] == fullscale["good_profile"]}
        n = 48
        if ("direct", n) in bad and ("gateway", n) in bad:
            d, g = bad[("direct", n)], bad[("gateway", n)]
            peak = max(r["total_tpm"] for (p, _), r in bad.items() if p == "direct")
            parts.append(
                f"The same shape at full scale: one bf16 8×B300 node ({fullscale['bad_profile']}) fed {n} "
                f"conversations directly falls to {fmt_tpm(d['total_tpm'])} tokens/min "
                f"({d['total_tpm'] / peak:.0%} of its simulated peak; the published collapsing deployment "
                f"measured 0.48M) with a median TTFT of {fmt_s(d['ttft_p50_s'])}; behind cachegate it serves "
                f"{fmt_tpm(g['total_tpm'])} ({g['total_tpm'] / d['total_tpm']:.1f}x) at {fmt_s(g['ttft_p50_s'])}."
            )
        if ("direct", n) in good and ("gateway", n) in good:
            d, g = good[("direct", n)], good[("gateway", n)]
            ratio = g["total_tpm"] / d["total_tpm"] if d["total_tpm"] else math.inf
            if ratio >= 1.1:  # e.g. DP ranks with separate caches: direct spreads a conversation over them
                lead = (
                    f"On the good deployment's engine ({fullscale['good_profile']}) cachegate serves "
                    f"{ratio:.1f}x what direct does"
                )
            elif ratio >= 0.9:
                lead = f"Where the cache is large enough ({fullscale['good_profile']}), cachegate costs nothing"
            else:
                lead = (
                    f"On the good deployment's engine ({fullscale['good_profile']}) cachegate gives up "
                    f"{1 - ratio:.0%} of direct's throughput"
                )
            parts.append(
                f"{lead}: {fmt_tpm(g['total_tpm'])} against {fmt_tpm(d['total_tpm'])} direct at {n} conversations, "
                f"p95 TTFT {fmt_s(g['ttft_p95_s'])} against {fmt_s(d['ttft_p95_s'])}."
            )
        parts.append(
            "In short: size the fleet so the busy hour's conversations fit the caches "
            "(<code>cachegate plan</code>), and let the gateway hold the rest back rather than let "
            "every engine thrash."
        )
    return " ".join(parts)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
main{max-width:1200px;margin:0 auto;padding:28px 32px 60px}
h1{font-size:26px;margin:0 0 6px} h2{margin:36px 0 8px;font-size:20px} .sub{color:#5b6673;margin:0 0 18px}
.verdict{background:#fff;border-left:6px solid #00798c;padding:16px 20px;font-size:18px;line-height:1.45;
 box-shadow:0 1px 3px rgba(0,0,0,.08);border-radius:6px}
.cards{display:flex;gap:14px;margin:18px 0;flex-wrap:wrap}
.card{flex:1 1 200px;background:#fff;border-radius:8px;padding:14px 16px;box-shadow:0 1px 3px rgba(0,0,0,.08)}
.card .big{font-size:30px;font-weight:700;color:#00798c} .card .bad{color:#d1495b}
.card .lbl{color:#5b6673;font-size:13px}
.pass{color:#2a7d2e;font-weight:600} .fail{color:#c0392b;font-weight:600}
img{width:100%;background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.08);margin:8px 0}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:8px 0;box-shadow:0 1px 3px rgba(0,0,0,.08)}
th,td{padding:5px 10px;text-align:right;border-bottom:1px solid #e6e8eb} th{background:#eef1f4}
tr.gateway td:nth-child(2){color:#00798c;font-weight:600} tr.direct td:nth-child(2){color:#d1495b;font-weight:600}
.meaning{background:#fff;padding:14px 20px;border-radius:8px;line-height:1.55;box-shadow:0 1px 3px rgba(0,0,0,.08)}
pre{background:#1d2733;color:#e6e8eb;padding:10px 14px;border-radius:6px;font-size:12px;overflow-x:auto}
.note{color:#5b6673;font-size:13px}
"""


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _x(x: float | None) -> str:
    return "-" if x is None or x == float("inf") else f"{x:.1f}x"


def _cards(v: dict | None, meta: dict) -> str:
    if v is None:
        return ""
    checks = "".join(
        f'<div class="{"pass" if ok else "fail"}">{"PASS" if ok else "FAIL"}: {html.escape(k.replace("_", " "))}</div>'
        for k, ok in v["checks"].items()
    )
    ttft = f"{v['ttft_ratio']:.0f}x" if v.get("ttft_ratio") else "-"
    return f"""<div class="cards">
<div class="card"><div class="big">{_x(v["tpm_ratio"])}</div><div class="lbl">cachegate's tokens/min over direct's
 at {v["conversations"]} conversations</div></div>
<div class="card"><div class="big">{ttft}</div><div class="lbl">shorter median time to first token
 ({fmt_s(v["gateway"]["ttft_p50_s"])} vs {fmt_s(v["direct"]["ttft_p50_s"])})</div></div>
<div class="card"><div class="big bad">{_pct(v["direct"]["of_peak"])}</div><div class="lbl">of its own peak left to
 direct; cachegate keeps {_pct(v["gateway"]["of_peak"])}</div></div>
<div class="card">{checks}<div class="lbl">wall time {meta.get("wall_s", "-")} s</div></div>
</div>"""


def _fullscale_section(fullscale: dict, out: Path) -> str:
    runs = fullscale["runs"]
    imgs = []
    for key, prof, which, label in (
        ("bf16", fullscale["bad_profile"], "bad", "published collapsing deployment"),
        ("good", fullscale["good_profile"], "good", "published good deployment"),
    ):
        sel = [dict(r, system=r["policy"]) for r in runs if r["profile"] == prof]
        _panel_pair(
            sel,
            out / f"fullscale-{key}.png",
            f"One 8×B300 node, {prof} (virtual time)",
            published=fullscale["published"][which],
            published_label=label,
        )
        imgs.append(f'<img src="fullscale-{key}.png" alt="{html.escape(prof)} simulated beside the {label}">')
    note = (
        f'<p class="note">The good deployment\'s fitted profile <code>b300-dp8-fp8-cp</code> is not in this '
        f"build, so its engine is stood in for by <code>{html.escape(fullscale['good_profile'])}</code>.</p>"
        if fullscale.get("good_is_fallback")
        else ""
    )
    return (
        f'<h2>Full scale, in virtual time</h2><p class="sub">The same engine model and the same gateway '
        f"policies at Kimi scale: {fullscale['minutes']:g} simulated minutes per point, the first "
        f"{fullscale['warmup_minutes']:g} left out, seed {fullscale['seed']}; open markers are the published "
        f"comparison's figures ({fullscale['cpu_s']} CPU-seconds for {len(runs)} runs).</p>{note}"
        + "".join(imgs)
        + f"<pre>{html.escape(fullscale['command'])}</pre>"
    )


def write_demo_report(
    rows: Sequence[dict], out: Path | str, title: str, meta: dict | None = None, fullscale: dict | None = None
) -> Path:
    """Write ``report.json``, the PNGs and ``index.html`` into ``out``; returns the index path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(meta or {})
    v = meta.get("verdict") or verdict(rows)
    (out / "report.json").write_bytes(
        orjson.dumps(
            {"title": title, **meta, "verdict": v, "runs": list(rows), "fullscale": fullscale},
            option=orjson.OPT_INDENT_2,
        )
    )
    cfg = meta.get("config", {})
    _panel_pair(rows, out / "live.png", "Live on this machine: simulated SGLang servers over real HTTP", hit=True)
    write_plots(rows, out)  # the live panels one by one (tpm.png, ttft.png, cache_hit.png)
    live = (
        f'<h2>Live, on this machine</h2><p class="sub">{cfg.get("backends", "?")} twins per system (profile '
        f"<code>{html.escape(str(cfg.get('profile', '?')))}</code>: a recomputed context costs seconds), "
        f"coding-agent at token scale {cfg.get('scale', '?')}, {cfg.get('duration_s', '?')} s per level of which "
        f"the first {cfg.get('warmup_s', '?')} s are left out, every level cold.</p>"
        f'<img src="live.png" alt="live sweep: tokens per minute, TTFT and cache hit">{_table(rows)}'
    )
    sections = [live]
    if fullscale:
        sections.append(_fullscale_section(fullscale, out))
    singles = ", ".join(f'<a href="{n}">{html.escape(c.lower())}</a>' for n, c in PLOTS.items())
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{CSS}</style></head>
<body><main>
<h1>cachegate: what happens past the cache's capacity</h1>
<p class="sub">{html.escape(title)}</p>
<div class="verdict">{html.escape(v["sentence"]) if v else "No live rows."}</div>
{_cards(v, meta)}
<h2>What this means</h2>
<div class="meaning">{meaning(v, fullscale)}</div>
{"".join(sections)}
<p class="note">Tokens per minute count input (cached included) plus output. Raw figures:
<a href="report.json">report.json</a>; the live panels one by one: {singles}; process logs in <code>logs/</code>.</p>
</main></body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path
