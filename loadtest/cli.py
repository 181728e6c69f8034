"""`cachegate simulate`, `cachegate loadtest`, `cachegate demo`."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import typer
from rich.console import Console

from backends.sim.profiles import PROFILES
from policies import registry


def _levels(spec: str) -> list[int]:
    try:
        levels = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected a comma-separated list of integers, got '{spec}'") from None
    if not levels or min(levels) <= 0:
        raise typer.BadParameter("conversation counts must be positive")
    return levels


def _fail(msg: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]cachegate:[/red] {msg}")
    return typer.Exit(code=2)


def _sim_one(cfg):  # type: ignore[no-untyped-def]  # a top-level function, so a worker process can run it
    from loadtest.sim.simulate import run_one

    t = time.perf_counter()
    row = run_one(cfg)
    return row, time.perf_counter() - t


def simulate(
    profile: str = typer.Option(
        ..., help=f"Engine profile ({', '.join(PROFILES)}); A+B: a mixed fleet, backends running A, B, A, ... in turn."
    ),
    unbounded: bool = typer.Option(False, help="Infinite KV: the ceiling a perfect cache would reach."),
    kv_tokens: int | None = typer.Option(None, help="Override the profile's KV capacity (tokens per rank)."),
    backends: int = typer.Option(1, min=1, help="Number of servers."),
    policy: str = typer.Option("direct", help=f"Policy stack: {', '.join(registry.names())}."),
    admission: str | None = typer.Option(
        None, help=f"Override the stack's admission half ({', '.join(registry.admission_names())})."
    ),
    routing: str | None = typer.Option(
        None, help=f"Override the stack's routing half ({', '.join(registry.routing_names())})."
    ),
    workload: str = typer.Option(
        "coding-agent", help="coding-agent | trace:PATH (Mooncake format) | a routing-family member."
    ),
    conversations: str = typer.Option("8,16,32,48,64", help="Concurrent conversations; a list is a sweep."),
    teams: str | None = typer.Option(
        None, help="NAME:N,NAME:N conversations per team (instead of --conversations; for trace: request shares)."
    ),
    minutes: float = typer.Option(20.0, help="Simulated minutes, warm-up included."),
    warmup_minutes: float = typer.Option(5.0, help="Minutes excluded from every figure."),
    seed: int = typer.Option(1, help="Workload seed."),
    warm_start: bool = typer.Option(
        False,
        help="coding-agent: enter each slot's first conversation at a random turn (conversations of every "
        "age from the start, as on a server that has been running; the caches still start cold).",
    ),
    json_path: Path | None = typer.Option(None, "--json", help='Write {"runs": [...]} here.'),
    speedup: float = typer.Option(1.0, help="trace: divide arrival times by this."),
    config: Path | None = typer.Option(
        None,
        help="A serve config file (deploy/cachegate.example.yaml's shape), "
        "validated as serve does: teams it lists, admission, router, "
        "breaker and health; stacks without admission ignore the teams.",
    ),
    scale: float = typer.Option(1.0, help="Multiply every workload token count."),
    think_scale: float = typer.Option(1.0, help="Multiply think times."),
    report: Path | None = typer.Option(None, help="Also write a report folder (plots, index.html)."),
    jobs: int = typer.Option(0, help="Runs in parallel (0: one per CPU core)."),
    oracle: bool = typer.Option(
        False,
        help="Hand the core the true conversation ids, token counts and "
        "output lengths (a ceiling; default: what serve knows).",
    ),
    max_tokens: int = typer.Option(0, min=0, help="max_tokens the simulated clients send (0: none)."),
    cancel_rate: float = typer.Option(
        0.0, min=0.0, max=1.0, help="Share of requests whose client leaves within 30 s of sending."
    ),
    unhealthy: str | None = typer.Option(
        None,
        help="NAME:START_S:END_S,...: a backend refuses connections "
        "(and drops its streams) in that window (e.g. b0:300:420).",
    ),
    lease_refusals: float = typer.Option(
        0.0, min=0.0, max=1.0, help="Share of dispatches whose team lease another replica holds (requeued)."
    ),
    visibility: str = typer.Option(
        "white",
        help="white: the core sees the engines' capacity and loads; blind: nothing but what the gateway "
        "observes (every backend engine: openai, its concurrency limit learned from time to first token).",
    ),
    cache_view: str = typer.Option(
        "approximate",
        help="approximate: the router's index learns from its own dispatches; precise: it follows the engines' "
        "KV cache events (what SGLang's --kv-events-config publishes).",
    ),
) -> None:
    """Run workloads against policies and engine profiles in virtual time."""
    import orjson

    from loadtest.results.tables import print_table, write_report
    from loadtest.sim.driver import Faults, parse_unhealthy
    from loadtest.sim.simulate import SimConfig, _load_config, build_core
    from loadtest.workloads.core import parse_teams
    from loadtest.workloads.spec import make_workload

    try:
        from backends.sim.engine import get_profile
        from loadtest.sim.simulate import fleet_profiles

        for name in fleet_profiles(profile):
            get_profile(name)
        build_core(policy, admission, routing)  # fail fast on unknown names
        make_workload(workload)
        team_specs = parse_teams(teams) if teams else None
        faults = Faults(
            cancel_rate=cancel_rate, unhealthy=parse_unhealthy(unhealthy), lease_refusal_rate=lease_refusals
        )
        if cache_view not in ("approximate", "precise"):
            raise ValueError(f"--cache-view: approximate or precise, not {cache_view!r}")
        if any(int(name[1:] if name[1:].isdigit() else -1) not in range(backends) for name, _, _ in faults.unhealthy):
            raise ValueError(f"--unhealthy: backends are named b0..b{backends - 1}")
    except (ValueError, ImportError) as exc:
        raise _fail(str(exc)) from None
    if visibility not in ("white", "blind"):
        raise _fail(f"--visibility {visibility!r}: white or blind")
    if config is not None and not config.is_file():
        raise _fail(f"config file not found: {config}")
    if config is not None:
        try:
            build_core(policy, admission, routing, _load_config(config))  # validated as serve validates it
        except ValueError as exc:
            raise _fail(f"{config}: {exc}") from None
    levels = [sum(t.conversations for t in team_specs)] if team_specs else _levels(conversations)
    if workload.startswith("trace:"):
        levels = levels[:1]
    cfgs = [
        SimConfig(
            profile=profile,
            backends=backends,
            policy=policy,
            admission=admission,
            routing=routing,
            workload=workload,
            conversations=n,
            teams=team_specs,
            minutes=minutes,
            warmup_minutes=warmup_minutes,
            seed=seed,
            warm_start=warm_start,
            kv_tokens=kv_tokens,
            unbounded=unbounded,
            scale=scale,
            think_scale=think_scale,
            speedup=speedup,
            config=config,
            oracle=oracle,
            max_tokens=max_tokens,
            faults=faults,
            visibility=visibility,
            cache_view=cache_view,
        )
        for n in levels
    ]
    console = Console()
    workers = min(len(cfgs), jobs or os.cpu_count() or 1)
    t0 = time.perf_counter()
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_sim_one, cfgs))
    else:
        results = [_sim_one(c) for c in cfgs]
    rows = []
    for row, wall in results:
        rows.append(row)
        console.print(
            f"[dim]simulated {row['conversations'] or '-'} conversations, {minutes:g} min: {wall:.1f} s wall[/dim]"
        )
    console.print(f"[dim]total {time.perf_counter() - t0:.1f} s wall ({workers} process(es))[/dim]")
    title = f"simulate: {workload} on {backends} x {profile}{' (unbounded)' if unbounded else ''}"
    print_table(rows, title, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps({"runs": rows}, option=orjson.OPT_INDENT_2))
    if report is not None:
        index = write_report(rows, report, title)
        console.print(f"report: {index}")


def loadtest(
    base_url: list[str] = typer.Option(
        ..., "--base-url", help="OpenAI-compatible base URL (repeatable: client-side round-robin)."
    ),
    api_key: str | None = typer.Option(None, envvar="CACHEGATE_API_KEY", help="Bearer key (per team: --teams)."),
    model: str = typer.Option("kimi-k2", help="Model name to request."),
    conversations: str = typer.Option("8", help="Concurrent conversations; a list is a sweep."),
    duration: float = typer.Option(60.0, help="Seconds per level."),
    warmup: float = typer.Option(0.0, help="Seconds at the start of each level excluded from figures."),
    workload: str = typer.Option("coding-agent", help="coding-agent | trace:PATH | a routing-family member."),
    json_path: Path | None = typer.Option(None, "--json", help='Write {"runs": [...]} here.'),
    report: Path | None = typer.Option(None, help="Write a report folder here."),
    seed: int = typer.Option(1, help="Workload seed."),
    teams: str | None = typer.Option(None, help="NAME:N[:KEY],... conversations (and API key) per team."),
    scale: float = typer.Option(1.0, help="Multiply every workload token count."),
    think_scale: float = typer.Option(1.0, help="Multiply think times (match a twin's --time-scale)."),
    speedup: float = typer.Option(1.0, help="trace: divide arrival times by this."),
    max_requests: int = typer.Option(100_000, min=1, help="Stop a level after this many requests."),
    system: str = typer.Option("target", help="Label of the system under test in the table."),
) -> None:
    """Drive an OpenAI-compatible URL with a workload in wall-clock time."""
    import asyncio

    import orjson

    from loadtest.live.client import LiveConfig, sweep
    from loadtest.results.tables import print_table, write_report
    from loadtest.workloads.core import parse_teams
    from loadtest.workloads.spec import make_workload

    try:
        make_workload(workload)
        team_specs = parse_teams(teams) if teams else None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    base = LiveConfig(
        base_urls=list(base_url),
        model=model,
        api_key=api_key,
        workload=workload,
        teams=team_specs,
        duration_s=duration,
        warmup_s=warmup,
        seed=seed,
        scale=scale,
        think_scale=think_scale,
        speedup=speedup,
        max_requests=max_requests,
        system=system,
    )
    rows = asyncio.run(sweep(base, _levels(conversations)))
    console = Console()
    print_table(rows, f"loadtest: {workload} -> {', '.join(base_url)}", console)
    if json_path is not None:
        json_path.write_bytes(orjson.dumps({"runs": rows}, option=orjson.OPT_INDENT_2))
    if report is not None:
        console.print(f"report: {write_report(rows, report, f'loadtest: {workload}')}")


def demo(
    report: Path = typer.Option(Path("cachegate-report"), help="Report folder."),
    conversations: str = typer.Option(
        "4,8,16,32", help="Concurrency sweep (the last level should oversubscribe the caches)."
    ),
    duration: float = typer.Option(30.0, help="Seconds per level, warm-up included (all systems at once)."),
    warmup: float = typer.Option(8.0, help="Seconds at the start of each level left out of its figures."),
    backends: int = typer.Option(2, min=1, help="Simulated servers per system."),
    profile: str = typer.Option("demo", help="Twin profile (demo: a recomputed context costs seconds)."),
    think_scale: float = typer.Option(0.25, help="Multiply the agents' 2-8 s think times."),
    fullscale: bool = typer.Option(
        True, "--fullscale/--no-fullscale", help="Also simulate the full-scale profiles for the report."
    ),
    sglang_router: str | None = typer.Option(
        None, "--sglang-router", help="A Python with sglang-router installed: adds SGLang's router as a third system."
    ),
) -> None:
    """Start simulated backends and the gateway, run a short sweep past the caches' capacity, write a report."""
    from loadtest.demo.run import DemoConfig, run_demo

    if not 0 <= warmup < duration:
        raise _fail("--warmup must be at least 0 and shorter than --duration")
    try:
        run_demo(
            DemoConfig(
                report=report,
                levels=_levels(conversations),
                duration_s=duration,
                warmup_s=warmup,
                backends=backends,
                profile=profile,
                think_scale=think_scale,
                fullscale=fullscale,
                sglang_router_python=sglang_router,
            )
        )
    except (RuntimeError, OSError) as exc:
        raise _fail(str(exc)) from None


def plan(
    teams: str = typer.Option(
        ..., help="NAME:DEVELOPERS:CONVERSATIONS_PER_DEVELOPER,... (busy-hour agent conversations per developer)."
    ),
    profile: str = typer.Option(
        ...,
        help=f"Hardware profile(s), comma-separated ({', '.join(p for p in PROFILES if p not in ('tiny', 'demo'))}).",
    ),
    ttft_p50: float = typer.Option(2.0, help="Target median time to first token (s)."),
    ttft_p95: float = typer.Option(20.0, help="Target p95 time to first token (s)."),
    max_wait: float = typer.Option(120.0, help="Longest acceptable wait for a seat (s; the longest TTFT)."),
    seeds: str = typer.Option("1,2,3", help="Seeds every candidate fleet is simulated with."),
    verify_seeds: str = typer.Option("101,102", help="Other seeds the recommended fleet is re-simulated with."),
    minutes: float = typer.Option(15.0, help="Simulated busy-hour minutes per run, warm-up included."),
    warmup_minutes: float = typer.Option(5.0, help="Minutes excluded from every figure."),
    max_servers: int = typer.Option(256, min=1, help="Give up above this many servers."),
    out: Path = typer.Option(Path("cachegate-plan"), help="Folder for plan.json, frontier.png, teams-*.yaml."),
    scale: float = typer.Option(1.0, hidden=True, help="Workload token scale (tests)."),
    think_scale: float = typer.Option(1.0, hidden=True, help="Workload think-time scale (tests)."),
    jobs: int = typer.Option(0, help="Simulations in parallel (0: one per CPU core)."),
) -> None:
    """Size a fleet: servers and team limits for N developers at a target TTFT (virtual time, gateway stack)."""
    from loadtest.plan.recommend import PlanConfig, Targets, parse_teams, run_plan
    from loadtest.plan.report import print_plan, write_plan

    try:
        team_list = parse_teams(teams)
        profiles = [p.strip() for p in profile.split(",") if p.strip()]
        from backends.sim.engine import get_profile

        for p in profiles:
            get_profile(p)
        seed_list = tuple(_levels(seeds))
        verify_list = tuple(_levels(verify_seeds))
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if min(ttft_p50, ttft_p95, max_wait) <= 0 or not 0 <= warmup_minutes < minutes:
        raise _fail("targets must be positive and --warmup-minutes shorter than --minutes")
    console = Console()
    cfg = PlanConfig(
        teams=team_list,
        profiles=profiles,
        targets=Targets(ttft_p50, ttft_p95, max_wait),
        seeds=seed_list,
        verify_seeds=verify_list,
        minutes=minutes,
        warmup_minutes=warmup_minutes,
        max_servers=max_servers,
        scale=scale,
        think_scale=think_scale,
        jobs=jobs,
    )
    total = sum(t.conversations for t in team_list)
    console.print(
        f"planning {sum(t.developers for t in team_list)} developers, {total} busy-hour conversations, "
        f"on {', '.join(profiles)}; {len(seed_list)} seeds per fleet"
    )
    result = run_plan(cfg, log=lambda m: console.print(f"[dim]{m}[/dim]"))
    print_plan(result, console)
    paths = write_plan(result, out)
    console.print(f"[dim]{result['wall_s']} s wall; wrote {', '.join(str(p) for p in paths)}[/dim]")
