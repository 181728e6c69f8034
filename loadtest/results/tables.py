"""Reports in the published comparison's layout: a terminal table and a report folder.

Rows: concurrency x system. Columns: total tokens/min (input incl. cached, plus output), median
and p95 TTFT, completed requests/min, median output tokens/s per request, cache hit rate; with
two or more systems, a ratio row per concurrency (each other system against the first).
The folder holds ``report.json``, three PNGs (matplotlib, Agg) and an ``index.html`` that uses
nothing but those files.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

PLOTS = {
    "tpm.png": "Total tokens per minute vs concurrency",
    "ttft.png": "Median and p95 time to first token vs concurrency (log scale)",
    "cache_hit.png": "Cache hit rate vs concurrency",
}


def system_of(row: dict) -> str:
    """The label of the system a row measured (live rows carry ``system``; simulated ones a policy)."""
    return str(row.get("system") or row.get("policy") or "?")


def systems(rows: Sequence[dict]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if system_of(r) not in seen:
            seen.append(system_of(r))
    return seen


def fmt_tpm(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f} s" if x < 100 else f"{x:.0f} s"


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


COLUMNS = ("Total tok/min", "TTFT p50", "TTFT p95", "Req/min", "Out tok/s p50", "Cache hit", "Max wait")


def _cells(r: dict) -> list[str]:
    hit = r.get("cache_hit_rate")
    return [
        fmt_tpm(r.get("total_tpm")),
        fmt_s(r.get("ttft_p50_s")),
        fmt_s(r.get("ttft_p95_s")),
        _fmt(r.get("completed_rpm"), ".1f"),
        _fmt(r.get("output_tps_p50"), ".1f"),
        "-" if hit is None else f"{hit:.1%}",
        fmt_s(r.get("max_wait_s")),
    ]


def comparison_table(rows: Sequence[dict], title: str = "cachegate") -> Table:
    """The published layout; ratio rows compare each system to the first one listed."""
    table = Table(title=title, header_style="bold")
    table.add_column("Conv.", justify="right")
    table.add_column("System")
    for c in COLUMNS:
        table.add_column(c, justify="right")
    names = systems(rows)
    levels = sorted({r.get("conversations") or 0 for r in rows})
    for level in levels:
        at = {system_of(r): r for r in rows if (r.get("conversations") or 0) == level}
        for name in names:
            if name in at:
                table.add_row(str(level or "-"), name, *_cells(at[name]))
        base = at.get(names[0])
        for name in names[1:]:
            other = at.get(name)
            if base is None or other is None:
                continue
            table.add_row(
                "",
                f"[dim]{name} / {names[0]}[/dim]",
                *(
                    f"[dim]{c}[/dim]"
                    for c in (
                        _ratio(other.get("total_tpm"), base.get("total_tpm")),
                        _ratio(other.get("ttft_p50_s"), base.get("ttft_p50_s")),
                        _ratio(other.get("ttft_p95_s"), base.get("ttft_p95_s")),
                        _ratio(other.get("completed_rpm"), base.get("completed_rpm")),
                        _ratio(other.get("output_tps_p50"), base.get("output_tps_p50")),
                        _ratio(other.get("cache_hit_rate"), base.get("cache_hit_rate")),
                        _ratio(other.get("max_wait_s"), base.get("max_wait_s")),
                    )
                ),
            )
        if level != levels[-1]:
            table.add_section()
    return table


def print_table(rows: Sequence[dict], title: str = "cachegate", console: Console | None = None) -> None:
    (console or Console()).print(comparison_table(rows, title))


def markdown_table(rows: Sequence[dict]) -> str:
    """The same table as Markdown (for docs)."""
    head = "| Conv. | System | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for level in sorted({r.get("conversations") or 0 for r in rows}):
        for r in rows:
            if (r.get("conversations") or 0) == level:
                lines.append(f"| {level or '-'} | {system_of(r)} | " + " | ".join(_cells(r)) + " |")
    return "\n".join(lines)


def _series(rows: Sequence[dict], key: str) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for name in systems(rows):
        pts = sorted(
            (r.get("conversations") or 0, r.get(key)) for r in rows if system_of(r) == name and r.get(key) is not None
        )
        out[name] = ([p[0] for p in pts], [float(p[1]) for p in pts])
    return out


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend. The plots are the ``report`` extra's, not the service's:
    without it, a clear message instead of a traceback."""
    try:
        import matplotlib
    except ModuleNotFoundError as exc:
        raise SystemExit("cachegate: the report's plots need matplotlib: pip install 'cachegate[report]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(rows: Sequence[dict], out: Path) -> list[Path]:
    plt = pyplot()

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, (xs, ys) in _series(rows, "total_tpm").items():
        ax.plot(xs, [y / 1e6 for y in ys], marker="o", label=name)
    ax.set(xlabel="concurrent conversations", ylabel="total tokens / min (M)", title=PLOTS["tpm.png"])
    paths.append(_save(fig, ax, out / "tpm.png"))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    p50, p95 = _series(rows, "ttft_p50_s"), _series(rows, "ttft_p95_s")
    for i, name in enumerate(systems(rows)):
        color = f"C{i}"
        ax.plot(*p50.get(name, ([], [])), marker="o", color=color, label=f"{name} p50")
        ax.plot(*p95.get(name, ([], [])), marker="^", linestyle="--", color=color, label=f"{name} p95")
    ax.set_yscale("log")
    ax.set(xlabel="concurrent conversations", ylabel="TTFT (s)", title=PLOTS["ttft.png"])
    paths.append(_save(fig, ax, out / "ttft.png"))

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, (xs, ys) in _series(rows, "cache_hit_rate").items():
        ax.plot(xs, [100 * y for y in ys], marker="o", label=name)
    ax.set(xlabel="concurrent conversations", ylabel="cache hit rate (%)", title=PLOTS["cache_hit.png"])
    ax.set_ylim(0, 100)
    paths.append(_save(fig, ax, out / "cache_hit.png"))
    return paths


def _save(fig, ax, path: Path) -> Path:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_html(rows: Sequence[dict], out: Path, title: str) -> Path:
    cells = ["<tr><th>Conv.</th><th>System</th>" + "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "</tr>"]
    for level in sorted({r.get("conversations") or 0 for r in rows}):
        for r in rows:
            if (r.get("conversations") or 0) == level:
                cells.append(
                    f"<tr><td>{level or '-'}</td><td>{html.escape(system_of(r))}</td>"
                    + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r))
                    + "</tr>"
                )
    figs = "\n".join(
        f'<figure><img src="{name}" alt="{html.escape(cap)}"><figcaption>{html.escape(cap)}</figcaption></figure>'
        for name, cap in PLOTS.items()
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
th, td {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
th {{ background: #f3f3f3; }}
figure {{ display: inline-block; margin: 0 1em 1em 0; }}
img {{ max-width: 700px; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Total tokens per minute count input (cached included) plus output. Raw figures:
<a href="report.json">report.json</a>.</p>
<table>
{chr(10).join(cells)}
</table>
{figs}
</body></html>
"""
    path = out / "index.html"
    path.write_text(page)
    return path


def write_report(
    rows: Sequence[dict], out: Path | str, title: str = "cachegate report", meta: dict | None = None
) -> Path:
    """Write ``report.json``, the PNGs and ``index.html`` to ``out``; returns the index path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_bytes(
        orjson.dumps({"title": title, **(meta or {}), "runs": list(rows)}, option=orjson.OPT_INDENT_2)
    )
    write_plots(rows, out)
    return write_html(rows, out, title)
