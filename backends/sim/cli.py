"""`cachegate sim-backend`: a simulated SGLang server (engine model behind SGLang 0.5.23's HTTP API)."""

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
    cache_report: bool = typer.Option(
        True,
        "--cache-report/--no-cache-report",
        help="Report usage.prompt_tokens_details.cached_tokens, as SGLang's --enable-cache-report does.",
    ),
    abort_delay: float = typer.Option(2.0, help="Wall seconds from a client disconnect to the abort."),
    reasoning: bool = typer.Option(False, help="Stream part of every answer as reasoning_content."),
    scale: float = typer.Option(
        1.0, help="Multiply answer lengths (log-uniform 200-1,500 tokens), like the load generator's --scale."
    ),
    routes: str = typer.Option(
        "all",
        help="Client surfaces served: all (SGLang 0.5.23: /v1/responses and /v1/messages), responses, or chat "
        "(an older build: chat and completions only, so a gateway must translate).",
    ),
    engine: str = typer.Option(
        "sglang",
        help="Whose HTTP API to speak: sglang (0.5.23) or vllm (0.33.0: /metrics with vllm: series, "
        "X-data-parallel-rank, vLLM's error envelope, no SGLang-only routes). The engine model is the same.",
    ),
    kv_events_config: str | None = typer.Option(
        None,
        help="SGLang's --kv-events-config JSON, e.g. "
        '\'{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", '
        '"topic": "kv-events"}\': '
        "publish BlockStored/BlockRemoved/AllBlocksCleared over ZMQ as SGLang 0.5.23 does (one port per DP rank; "
        "needs pyzmq).",
    ),
    log_level: str = typer.Option("warning", help="uvicorn log level."),
    disaggregation_mode: str = typer.Option(
        "null", help="SGLang's PD role: null, prefill or decode (docs/disaggregation.md; backends/sim/disagg.py)."
    ),
    disaggregation_bootstrap_port: int = typer.Option(
        8998, help="A prefill twin's bootstrap server port (decode twins fetch a room's KV there)."
    ),
) -> None:
    """Run a simulated SGLang server (replaced by :data:`HELP` below)."""
    from backends.sim.serve import serve

    if time_scale <= 0 or scale <= 0:
        typer.echo("cachegate sim-backend: --time-scale and --scale must be > 0", err=True)
        raise typer.Exit(code=2)
    try:
        serve(
            profile,
            host=host,
            port=port,
            log_level=log_level,
            time_scale=time_scale,
            model=model,
            kv_tokens=kv_tokens,
            unbounded=unbounded,
            cache_report=cache_report,
            abort_delay_s=abort_delay,
            reasoning=reasoning,
            answer_scale=scale,
            routes=routes,
            engine=engine,
            disaggregation_mode=disaggregation_mode,
            disaggregation_bootstrap_port=disaggregation_bootstrap_port,
            kv_events_config=kv_events_config,
        )
    except (ValueError, RuntimeError) as exc:
        typer.echo(f"cachegate sim-backend: {exc}", err=True)
        raise typer.Exit(code=2) from None


def _paragraph(*parts: str) -> str:
    return " ".join(parts)


HELP = "\n\n".join(
    (
        "Run a simulated SGLang server (engine model behind SGLang's HTTP API).",
        "How it answers (deterministic, seeded by the request's seed and prompt):",
        _paragraph(
            "Tools: when a request offers tools and ends with a fresh user turn, the answer is one tool call",
            "(finish_reason tool_calls, Kimi id functions.NAME:N) on one offered tool, preferring a read-only one",
            "by name (read, view, list, glob, grep, search, get...), with arguments valid against its JSON schema",
            "(a path is README.md, a directory the client's working directory, an enum its first value...).",
            "After the tool result(s) the answer is text with finish_reason stop. tool_choice none, required or a",
            "named function is honoured. No magic words.",
        ),
        _paragraph(
            "Length: answers are log-uniform over 200-1,500 tokens times --scale and stop there (finish_reason",
            "stop); a smaller max_tokens cuts them (length); ignore_eos: true generates exactly max_tokens, as on",
            "SGLang.",
        ),
        _paragraph(
            "Context: every profile serves Kimi's 262,144-token window (max_model_len); only a prompt (+",
            "max_tokens) past it is refused with 400. The KV pool is the profile's.",
        ),
        _paragraph(
            "Disaggregated (--disaggregation-mode prefill|decode): SGLang's PD roles; a request without",
            "bootstrap_room is refused (400); a prefill twin answers one token once a decode twin took the room",
            "from its bootstrap port; a decode twin fetches the room, then generates. GET /_twin/disagg: pending",
            "legs and the fields each request carried (docs/disaggregation.md).",
        ),
    )
)
sim_backend.__doc__ = HELP


if __name__ == "__main__":
    typer.run(sim_backend)
