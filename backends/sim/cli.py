"""`cachegate sim-backend`: a simulated SGLang server (implemented by the twin)."""

from __future__ import annotations

import typer


def sim_backend(
    profile: str = typer.Option("tiny", help="Engine profile name."),
    port: int = typer.Option(30000, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    time_scale: float = typer.Option(1.0, help="Wall seconds per engine second (0.1: ten times faster)."),
    model: str = typer.Option("moonshotai/Kimi-K2-Instruct", help="Served model name."),
    unbounded: bool = typer.Option(False, help="Infinite KV (the perfect-cache ceiling)."),
    kv_tokens: int | None = typer.Option(None, help="Override the profile's KV capacity."),
) -> None:
    """Run a simulated SGLang server (engine model behind SGLang's HTTP API)."""
    raise typer.Exit(code=2)
