"""What `cachegate plan` prints and writes: per profile the recommendation, each team's limits and
figures, the frontier (servers against TTFT and tokens/min) as a table and a PNG, and a ``teams:``
config snippet."""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml
from rich.console import Console
from rich.table import Table

from loadtest.results.tables import fmt_s, fmt_tpm, pyplot


def snippet(result: dict) -> str:
    """A ready-to-use config fragment: the ``teams:`` limits, with the fleet it was planned for."""
    head = f"# cachegate plan: {result['servers']} x {result['profile']} ({result['server']})\npolicy: gateway\n"
    return head + yaml.safe_dump({"teams": result["teams"]}, sort_keys=False, default_flow_style=None)


def frontier_table(result: dict, targets: dict) -> Table:
    t = Table(title=f"{result['profile']}: frontier (median over seeds; worst seed in brackets)", header_style="bold")
    for col in ("Servers", "Meets", "Tokens/min", "TTFT p50", "TTFT p95", "Longest wait", "Cache hit"):
        t.add_column(col, justify="right")
    for p in result["frontier"]:
        rec = p["servers"] == result.get("servers")
        mark = "[bold green]" if rec else ""
        t.add_row(
            f"{mark}{p['servers']}{' ←' if rec else ''}",
            f"{p['seeds_passed']}/{p['seeds']}",
            fmt_tpm(p["total_tpm"]),
            fmt_s(p["ttft_p50_s"]),
            f"{fmt_s(p['ttft_p95_s'])} ({fmt_s(p['worst_ttft_p95_s'])})",
            f"{fmt_s(p['max_wait_s'])} ({fmt_s(p['worst_max_wait_s'])})",
            "-" if p["cache_hit_rate"] is None else f"{p['cache_hit_rate']:.1%}",
        )
    t.caption = (
        f"targets: TTFT p50 ≤ {targets['ttft_p50_s']:g} s, p95 ≤ {targets['ttft_p95_s']:g} s, "
        f"longest wait ≤ {targets['max_wait_s']:g} s, on every seed"
    )
    return t


def teams_table(result: dict) -> Table:
    t = Table(title=f"{result['profile']}: teams on {result['servers']} server(s)", header_style="bold")
    for col in ("Team", "max_concurrency", "Peak in flight", "Tokens/min", "TTFT p50", "TTFT p95"):
        t.add_column(col, justify="right")
    for name, lim in result["teams"].items():
        fig = result["per_team"].get(name, {})
        t.add_row(
            name,
            str(lim["max_concurrency"]),
            str(fig.get("peak_inflight", "-")),
            fmt_tpm(fig.get("total_tpm")),
            fmt_s(fig.get("ttft_p50_s")),
            fmt_s(fig.get("ttft_p95_s")),
        )
    return t


def headline(result: dict, targets: dict) -> str:
    if result.get("servers") is None:
        worst = result["frontier"][-1] if result["frontier"] else None
        tail = (
            (
                f" (at {worst['servers']} servers: p50 {fmt_s(worst['ttft_p50_s'])}, p95 "
                f"{fmt_s(worst['ttft_p95_s'])}, longest wait {fmt_s(worst['max_wait_s'])})"
            )
            if worst
            else ""
        )
        return f"{result['profile']}: no fleet up to the search limit meets the targets{tail}."
    r, v = result["recommended"], result["verify"]
    below = next((p for p in result["frontier"] if p["servers"] == result["servers"] - 1), None)
    rejected = {x["servers"]: x["verify"] for x in result.get("rejected", [])}
    miss = ""
    if below is not None and below["servers"] in rejected:
        chk = rejected[below["servers"]]
        miss = (
            f"; {below['servers']} met the targets on the search seeds but missed them on "
            f"{chk['seeds'] - chk['seeds_passed']}/{chk['seeds']} check seeds (longest wait "
            f"{fmt_s(chk['worst_max_wait_s'])})"
        )
    elif below is not None:
        miss = (
            f"; {below['servers']} would miss them on {below['seeds'] - below['seeds_passed']}/{below['seeds']} "
            f"seeds (p50 {fmt_s(below['ttft_p50_s'])}, p95 {fmt_s(below['ttft_p95_s'])}, "
            f"longest wait {fmt_s(below['max_wait_s'])})"
        )
    return (
        f"{result['profile']}: {result['servers']} server(s) ({result['server']}) serve "
        f"{fmt_tpm(r['total_tpm'])} tokens/min with TTFT p50 {fmt_s(r['ttft_p50_s'])}, p95 "
        f"{fmt_s(r['ttft_p95_s'])} and a longest wait of {fmt_s(r['max_wait_s'])}; re-simulated with the team "
        f"limits on {v['seeds']} other seeds: {v['seeds_passed']}/{v['seeds']} meet the targets{miss}."
    )


def print_plan(plan: dict, console: Console | None = None) -> None:
    console = console or Console()
    for result in plan["profiles"]:
        console.print(frontier_table(result, plan["targets"]))
        if result.get("servers") is not None:
            console.print(teams_table(result))
            console.print(f"[dim]{snippet(result)}[/dim]")
        console.print(f"[bold]{headline(result, plan['targets'])}[/bold]")
        console.print(
            f"[dim]{result['simulations']} simulations, {result['cpu_s']} CPU-s, {result['wall_s']} s wall[/dim]\n"
        )


def frontier_png(plan: dict, path: Path) -> Path:
    """Per profile: TTFT p50 / p95 and longest wait (log) and tokens/min against servers, targets dashed."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    results = plan["profiles"]
    fig, axes = plt.subplots(1, len(results), figsize=(6.2 * len(results), 4.8), squeeze=False)
    tg = plan["targets"]
    for ax, res in zip(axes[0], results, strict=True):
        pts = res["frontier"]
        xs = [p["servers"] for p in pts]
        for key, label, style, color in (
            ("ttft_p50_s", "TTFT p50", "-o", "#00798c"),
            ("ttft_p95_s", "TTFT p95", "--^", "#00798c"),
            ("max_wait_s", "longest wait", ":s", "#d1495b"),
        ):
            ax.plot(xs, [p[key] for p in pts], style, color=color, label=label)
        for val, color in ((tg["ttft_p50_s"], "#00798c"), (tg["ttft_p95_s"], "#00798c"), (tg["max_wait_s"], "#d1495b")):
            ax.axhline(val, color=color, linewidth=0.8, linestyle=(0, (4, 4)), alpha=0.6)
        ax.set_yscale("log")
        ax.set(xlabel="servers", ylabel="seconds (log); dashed lines: targets", title=res["profile"])
        if res.get("servers") is not None:
            ax.axvline(res["servers"], color="#2a7d2e", linewidth=6, alpha=0.15, label="recommended")
        right = ax.twinx()
        right.plot(xs, [p["total_tpm"] / 1e6 for p in pts], "-D", color="#555555", alpha=0.7, label="tokens/min")
        right.set_ylabel("total tokens / min (M)")
        right.set_ylim(bottom=0)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = right.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, frameon=False, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plan(plan: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "plan.json"]
    paths[0].write_bytes(orjson.dumps(plan, option=orjson.OPT_INDENT_2))
    paths.append(frontier_png(plan, out / "frontier.png"))
    for result in plan["profiles"]:
        if result.get("servers") is not None:
            p = out / f"teams-{result['profile']}.yaml"
            p.write_text(snippet(result))
            paths.append(p)
    return paths
