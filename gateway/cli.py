"""The `cachegate` command: serve, sim-backend, and where the load-test tools are installed simulate,
compare, loadtest, demo, plan, bench, chaos.

The one module above every package: it reaches ``loadtest`` and the simulated SGLang, which the
running service never imports. The service's image carries no ``loadtest``; its commands are then
left out of the CLI, and ``serve`` and ``sim-backend`` work as ever."""

from __future__ import annotations

import typer

from backends.sim.cli import sim_backend

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="cachegate: an OpenAI-compatible gateway with admission control for SGLang.",
)

app.command("sim-backend")(sim_backend)


def bench(ctx: typer.Context) -> None:
    """The relay benchmark (loadtest/bench/relay.py): cachegate against sglang-router; --help for options."""
    from loadtest.bench.relay import main as bench_main

    bench_main(list(ctx.args))


def chaos(
    mode: str = typer.Argument("faults", help="faults | soak | slow | hol"),
    faults: int = typer.Option(1000, "--faults", help="faults: how many to inject (all kinds)."),
    replicas: int = typer.Option(2, "--replicas", help="faults: gateway replicas sharing a private Redis."),
    limit: int = typer.Option(4, "--limit", help="faults: each team's max_concurrency."),
    redis_restarts: int = typer.Option(10, "--redis-restarts", help="faults: Redis restarts among them."),
    minutes: float = typer.Option(30.0, "--minutes", help="soak: how long."),
    rate: float = typer.Option(4.0, "--rate", help="soak and slow: normal requests per second."),
    connections: int = typer.Option(2000, "--connections", help="slow: slow or idle connections."),
    hold: float = typer.Option(120.0, "--hold", help="slow: seconds the connections are held."),
    seed: int = typer.Option(1, "--seed"),
    skip: list[str] = typer.Option([], "--skip", help="faults: a fault kind to leave out (repeatable)."),
) -> None:
    """Reliability runs on a private stack (twins, Redis, replicas): faults, soak, slow connections,
    hol (an oversized prompt retried in a loop against another team's requests). docs/reliability.md."""
    import asyncio
    import functools

    from loadtest.chaos import runs as runs

    out = functools.partial(print, flush=True)
    if mode == "faults":
        asyncio.run(
            runs.run_faults(
                faults,
                replicas=replicas,
                limit=limit,
                seed=seed,
                redis_restarts=redis_restarts,
                skip=tuple(skip),
                out=out,
            )
        )
    elif mode == "soak":
        asyncio.run(runs.run_soak(minutes, rate, out=out))
    elif mode == "slow":
        asyncio.run(runs.run_slow(connections, hold, rate=rate, out=out))
    elif mode == "hol":
        asyncio.run(runs.run_hol(out=out))
    else:
        raise typer.BadParameter("mode must be faults, soak, slow or hol")


@app.command("serve")
def serve(
    config: str | None = typer.Option(
        None, "--config", help="YAML configuration file (annotated example: deploy/cachegate.example.yaml)."
    ),
    backend: list[str] = typer.Option([], "--backend", help="Backend URL (repeatable); needs --model."),
    model: str | None = typer.Option(None, "--model", help="Model alias clients use (quick start)."),
    prefill: list[str] = typer.Option(
        [],
        "--prefill",
        help="Prefill backend URL[:BOOTSTRAP_PORT] of a disaggregated pool (repeatable; bootstrap port 8998 "
        "by default); needs --decode and --model.",
    ),
    decode: list[str] = typer.Option([], "--decode", help="Decode backend URL (repeatable); needs --prefill."),
    api_key: list[str] = typer.Option([], "--api-key", help="KEY or KEY=TEAM (repeatable)."),
    host: str | None = typer.Option(None, "--host", help="Listen address (default 127.0.0.1)."),
    port: int | None = typer.Option(None, "--port", help="Listen port (default 8080)."),
    workers: int | None = typer.Option(
        None, "--workers", help="Worker processes (default: one per core with Redis, else 1; several need Redis)."
    ),
    redis_url: str | None = typer.Option(None, "--redis-url", help="Redis URL for shared state."),
    policy: str | None = typer.Option(
        None, "--policy", help="Policy stack: gateway (default), direct, round-robin, least-load, sglang-cache-aware."
    ),
    log_level: str | None = typer.Option(None, "--log-level", help="debug, info, warning, error."),
    access_log: str | None = typer.Option(
        None, "--access-log", help="One line per request on stderr: text, json, off."
    ),
    admin_token: str | None = typer.Option(
        None, "--admin-token", help="Token for /admin/ (else $CACHEGATE_ADMIN_TOKEN; off if none)."
    ),
) -> None:
    """Run the gateway."""
    import os

    from backends.config import pd_backends
    from gateway.config.schema import load_config
    from gateway.serve import run

    try:
        cfg = load_config(
            config,
            backends=[*backend, *pd_backends(prefill, decode)],
            model=model,
            api_keys=api_key,
            host=host,
            port=port,
            workers=workers,
            redis_url=redis_url,
            policy=policy,
            log_level=log_level,
            access_log=access_log,
        )
    except (ValueError, OSError) as exc:
        typer.echo(f"cachegate: invalid configuration: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if admin_token:
        os.environ[cfg.admin_token_env] = admin_token  # workers read it from the environment too
    run(cfg)


def _add_tools() -> None:
    """The load-test tools' commands, where ``loadtest`` is installed."""
    try:
        from loadtest.cli import demo, loadtest, plan, simulate
        from loadtest.compare_cli import compare
    except ModuleNotFoundError as exc:
        if exc.name != "loadtest":
            raise  # a tool's own dependency is missing: say so, do not hide the commands
        return
    app.command("simulate")(simulate)
    app.command("loadtest")(loadtest)
    app.command("demo")(demo)
    app.command("plan")(plan)
    app.command("compare")(compare)
    app.command(
        "bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
    )(bench)
    app.command("chaos")(chaos)


_add_tools()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
