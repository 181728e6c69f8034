"""`cachegate simulate`, `cachegate loadtest`, `cachegate demo` (implemented by the load-generation work)."""

from __future__ import annotations

import typer


def simulate() -> None:
    """Run workloads against policies and engine profiles in virtual time."""
    raise typer.Exit(code=2)


def loadtest() -> None:
    """Drive an OpenAI-compatible URL with a workload in wall-clock time."""
    raise typer.Exit(code=2)


def demo() -> None:
    """Start simulated backends and the gateway, run a short sweep, write a report."""
    raise typer.Exit(code=2)
