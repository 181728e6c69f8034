"""`cachegate compare`: prints ``loadtest/analysis/compare.py``'s table (one row per stack per level and seed)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from backends.sim.profiles import PROFILES
from loadtest.analysis.compare import FIGURES, STACKS, Cell, _fmt, as_json, as_markdown, best, run_compare, summary


def print_cells(profile: str, backends: int, cells: list[Cell], console: Console) -> None:
    table = Table(title=f"compare: coding-agent on {backends} x {profile} (ratio: gateway / best of direct, sglang)")
    table.add_column("Conv.", justify="right")
    table.add_column("Seed", justify="right")
    table.add_column("Stack")
    for _, label in FIGURES:
        table.add_column(label, justify="right")
    table.add_column("Verdict")
    for cell in cells:
        failed = {c.figure for c in cell.checks if not c.ok}
        for stack in STACKS:
            row = cell.rows[stack]
            values = []
            for key, _ in FIGURES:
                text = _fmt(key, row[key])
                if stack == "gateway":
                    ref = best(cell.rows, key)
                    ratio = f" ({row[key] / ref:.2f}x)" if ref else ""
                    text = f"[red]{text}{ratio}[/red]" if key in failed else f"{text}{ratio}"
                values.append(text)
            verdict = ""
            if stack == "gateway":
                verdict = "no line" if not cell.checks else ("PASS" if cell.ok else "FAIL")
            table.add_row(
                str(cell.level) if stack == "gateway" else "",
                str(cell.seed) if stack == "gateway" else "",
                stack if stack != "ceiling" else "ceiling (unbounded KV)",
                *values,
                verdict,
                end_section=stack == STACKS[-1],
            )
    console.print(table)
    passed, total, failed_lines = summary(cells)
    console.print(f"{passed}/{total} acceptance checks pass")
    for line in failed_lines:
        console.print(f"  [red]{line}[/red]")


def compare(
    profile: str = typer.Option(..., help=f"Engine profile ({', '.join(PROFILES)})."),
    conversations: str = typer.Option("8,16,32,48,64,96,128", help="Conversation levels."),
    seeds: str = typer.Option("1,2", help="Workload seeds."),
    backends: int = typer.Option(1, min=1, help="Number of servers."),
    minutes: float = typer.Option(20.0, help="Simulated minutes, warm-up included."),
    warmup_minutes: float = typer.Option(5.0, help="Minutes excluded from every figure."),
    config: Path | None = typer.Option(None, help="A serve config file for the gateway stack (teams, admission)."),
    json_path: Path | None = typer.Option(None, "--json", help="Also write the cells and checks here."),
    markdown: Path | None = typer.Option(None, help="Also write one Markdown row per level and seed here."),
    jobs: int = typer.Option(0, help="Runs in parallel (0: one per CPU core)."),
    scale: float = typer.Option(1.0, hidden=True, help="Workload token scale (tests)."),
) -> None:
    """Gateway beside direct, sglang-cache-aware and the unbounded-cache ceiling, with issue #32's checks."""
    from loadtest.cli import _fail, _levels

    if profile not in PROFILES:
        raise _fail(f"unknown profile '{profile}'; known: {', '.join(PROFILES)}")
    if not 0 <= warmup_minutes < minutes:
        raise _fail("--warmup-minutes must be shorter than --minutes")
    console = Console(width=150)  # the table's nine columns; narrower terminals wrap lines, not cells
    cells = run_compare(
        profile,
        _levels(conversations),
        _levels(seeds),
        backends=backends,
        minutes=minutes,
        warmup=warmup_minutes,
        config=config,
        jobs=jobs,
        scale=scale,
    )
    print_cells(profile, backends, cells, console)
    if json_path is not None:
        json_path.write_text(json.dumps(as_json(profile, backends, cells), indent=1))
    if markdown is not None:
        markdown.write_text(as_markdown(profile, cells) + "\n")
