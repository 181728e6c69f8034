"""The `cachegate` command: serve, sim-backend, simulate, loadtest, demo, plan, bench."""

from __future__ import annotations

import typer

from backends.sim.cli import sim_backend
from loadtest.cli import demo, loadtest, plan, simulate

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="cachegate: an OpenAI-compatible gateway with admission control for SGLang.")

app.command("sim-backend")(sim_backend)
app.command("simulate")(simulate)
app.command("loadtest")(loadtest)
app.command("demo")(demo)
app.command("plan")(plan)


@app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                        "help_option_names": []})
def bench(ctx: typer.Context) -> None:
    """The relay benchmark (loadtest/bench_relay.py): cachegate against sglang-router; --help for options."""
    from loadtest.bench_relay import main as bench_main

    bench_main(list(ctx.args))


@app.command("serve")
def serve(
    config: str | None = typer.Option(
        None, "--config", help="YAML configuration file (annotated example: deploy/cachegate.example.yaml)."),
    backend: list[str] = typer.Option([], "--backend", help="Backend URL (repeatable); needs --model."),
    model: str | None = typer.Option(None, "--model", help="Model alias clients use (quick start)."),
    api_key: list[str] = typer.Option([], "--api-key", help="KEY or KEY=TEAM (repeatable)."),
    host: str | None = typer.Option(None, "--host", help="Listen address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="Listen port (default 8080)."),
    workers: int | None = typer.Option(
        None, "--workers", help="Worker processes (default: one per core with Redis, else 1; several need Redis)."),
    redis_url: str | None = typer.Option(None, "--redis-url", help="Redis URL for shared state."),
    policy: str | None = typer.Option(
        None, "--policy", help="Policy stack: gateway (default), direct, round-robin, least-load, sglang-cache-aware."),
    log_level: str | None = typer.Option(None, "--log-level", help="debug, info, warning, error."),
    access_log: str | None = typer.Option(None, "--access-log",
                                          help="One line per request on logger cachegate.access: text, json, off."),
    admin_token: str | None = typer.Option(None, "--admin-token",
                                           help="Token for /admin/ (else $CACHEGATE_ADMIN_TOKEN; off if none)."),
) -> None:
    """Run the gateway."""
    import os

    from gateway.config import load_config
    from gateway.serve import run

    try:
        cfg = load_config(config, backends=backend, model=model, api_keys=api_key, host=host, port=port,
                          workers=workers, redis_url=redis_url, policy=policy, log_level=log_level,
                          access_log=access_log)
    except (ValueError, OSError) as exc:
        typer.echo(f"cachegate: invalid configuration: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if admin_token:
        os.environ[cfg.admin_token_env] = admin_token  # workers read it from the environment too
    run(cfg)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
