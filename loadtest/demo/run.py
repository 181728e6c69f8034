"""`cachegate demo`: simulated SGLang servers, the gateway, a short sweep that crosses the caches'
capacity, a live table, a one-sentence verdict and a report folder.

Each system under test gets its own set of identical twins (profile ``demo``: a recomputed context
costs seconds, see ``backends/sim/demo_profile.py``), and the systems run every level side by side
on their own twins, so a level costs one slot of wall time, not one per system. Every level starts
cold: the twins' caches are flushed and each gateway is restarted (so it holds no seat or prefix of an
earlier level's conversations). Every level and system uses the same seed, so slot i runs the same
conversation at every level and a higher level adds conversations to a lower one's.
The workload enters each conversation at a random turn (``warm_start``), so the few seconds a level
lasts see conversations of every age; the first ``warmup_s`` of a level are left out of its figures.

Meanwhile a low-priority process pool simulates the full-scale profiles in virtual time
(``loadtest/demo/fullscale.py``) for the report. Every process started here is stopped on the way out
(normal end, error or Ctrl-C), by its own pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

from backends.sim.demo_profile import DEMO_PROFILE
from loadtest.demo.processes import Processes as Processes
from loadtest.demo.processes import flush as flush
from loadtest.demo.processes import free_port as free_port
from loadtest.demo.processes import wait_ready as wait_ready
from loadtest.demo.report import verdict, write_demo_report
from loadtest.live.client import LevelState, LiveConfig, run_level
from loadtest.results.metrics import summarize
from loadtest.results.tables import fmt_s, fmt_tpm, print_table

MODEL = "kimi-k2"
SCALE = 0.032
"""Token scale: 20k-250k-token conversations become ~0.6k-8k."""
THINK_SCALE = 0.25


@dataclass
class DemoConfig:
    report: Path = Path("cachegate-report")
    levels: list[int] = field(default_factory=lambda: [4, 8, 16, 32])
    duration_s: float = 30.0
    """Seconds per level, warm-up included (all systems at once)."""
    warmup_s: float = 8.0
    backends: int = 2
    """Twins per system."""
    profile: str = DEMO_PROFILE
    scale: float = SCALE
    time_scale: float = 1.0
    think_scale: float = THINK_SCALE
    seed: int = 1
    startup_timeout_s: float = 30.0
    show_progress: bool = True
    fullscale: bool = True
    """Simulate the full-scale profiles for the report while the sweep runs."""
    fullscale_minutes: float = 15.0
    sglang_router_python: str | None = None
    """A Python with ``sglang-router`` installed: adds SGLang's own router (``cache_aware``) as a third
    system on its own twins (``pip install sglang-router`` in another virtualenv)."""


@dataclass
class System:
    """One system under test: its own twins, and a front process (gateway, router) or none."""

    name: str
    twins: list[str]
    front: str | None = None
    proc: subprocess.Popen | None = None

    def targets(self) -> list[str]:
        return [self.front] if self.front else self.twins


def start_twins(cfg: DemoConfig, procs: Processes, system: str) -> list[str]:
    started = []
    for i in range(cfg.backends):
        port = free_port()
        name = f"{system}-twin{i}"
        proc = procs.start(
            name,
            [
                "sim-backend",
                "--profile",
                cfg.profile,
                "--port",
                str(port),
                "--time-scale",
                str(cfg.time_scale),
                "--model",
                MODEL,
            ],
        )
        started.append((name, proc, f"http://127.0.0.1:{port}"))
    for name, proc, url in started:
        wait_ready(procs, name, proc, f"{url}/health", cfg.startup_timeout_s)
    return [url for _, _, url in started]


def start_gateway(cfg: DemoConfig, procs: Processes, sysm: System) -> None:
    """(Re)start the gateway in front of ``sysm``'s twins: a cold gateway for a cold level."""
    if sysm.proc is not None:
        procs.stop([sysm.proc])
    port = free_port()
    args = ["serve", "--model", MODEL, "--port", str(port), "--host", "127.0.0.1", "--log-level", "warning"]
    for url in sysm.twins:
        args += ["--backend", url]
    sysm.proc = procs.start(sysm.name, args)
    sysm.front = f"http://127.0.0.1:{port}"
    wait_ready(procs, sysm.name, sysm.proc, f"{sysm.front}/readyz", cfg.startup_timeout_s)


def start_sglang_router(cfg: DemoConfig, procs: Processes, sysm: System) -> None:
    """SGLang's router (``cache_aware``, its launcher's defaults) in front of ``sysm``'s twins."""
    assert cfg.sglang_router_python
    if sysm.proc is not None:
        procs.stop([sysm.proc])
    port, metrics = free_port(), free_port()
    sysm.proc = procs.start(
        sysm.name,
        [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            *sysm.twins,
            "--policy",
            "cache_aware",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics),
            "--log-level",
            "warn",
        ],
        python=cfg.sglang_router_python,
        module="sglang_router.launch_router",
    )
    sysm.front = f"http://127.0.0.1:{port}"
    wait_ready(procs, sysm.name, sysm.proc, f"{sysm.front}/readiness", cfg.startup_timeout_s)


def _reset(cfg: DemoConfig, procs: Processes, sysm: System) -> None:
    flush(sysm.twins)
    if sysm.name == "gateway":
        start_gateway(cfg, procs, sysm)
    elif sysm.name == "sglang-router":
        start_sglang_router(cfg, procs, sysm)


# -- the live table --------------------------------------------------------------------------------


def live_table(cfg: DemoConfig, names: list[str], states: dict[tuple[int, str], LevelState], levels_done: int) -> Table:
    table = Table(
        title=f"cachegate demo: {' vs '.join(names)}, {cfg.backends} twins each "
        f"(profile {cfg.profile}), {cfg.duration_s:g} s per level",
        header_style="bold",
    )
    table.add_column("Conv.", justify="right")
    table.add_column("Level", min_width=24)
    for n in names:
        table.add_column(f"{n}\ntok/min", justify="right")
        table.add_column(f"{n}\nTTFT p50", justify="right")
    for i, level in enumerate(cfg.levels):
        row_states = [states.get((level, n)) for n in names]
        started = [s for s in row_states if s is not None]
        elapsed = max((s.elapsed() for s in started), default=0.0)
        done = i < levels_done
        bar = ProgressBar(
            total=cfg.duration_s,
            completed=cfg.duration_s if done else min(elapsed, cfg.duration_s),
            width=18,
            complete_style="green" if done else "cyan",
        )
        label = Table.grid(padding=(0, 1))
        label.add_row(
            bar,
            "done"
            if done
            else ("warm-up" if started and elapsed < cfg.warmup_s else f"{elapsed:.0f} s" if started else "waiting"),
        )
        cells: list[object] = [str(level), label]
        for s in row_states:
            if s is None or s.elapsed() <= cfg.warmup_s:
                cells += ["-", "-"]
                continue
            fig = summarize(s.records, cfg.warmup_s, s.elapsed())
            cells += [fmt_tpm(fig["total_tpm"]), fmt_s(fig["ttft_p50_s"])]
        table.add_row(*cells)  # type: ignore[arg-type]
    return table


async def _sweep(cfg: DemoConfig, procs: Processes, systems: list[System], console: Console) -> list[dict]:
    names = [s.name for s in systems]
    states: dict[tuple[int, str], LevelState] = {}
    rows: list[dict] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
    done = [0]
    try:
        with Live(
            live_table(cfg, names, states, 0),
            console=console,
            refresh_per_second=4,
            auto_refresh=cfg.show_progress and console.is_terminal,
        ) as live:
            for i, level in enumerate(cfg.levels):
                if stop.is_set():
                    break
                with ThreadPoolExecutor(len(systems)) as pool:
                    for f in [pool.submit(_reset, cfg, procs, s) for s in systems]:
                        await asyncio.wrap_future(f)
                base = dict(
                    model=MODEL,
                    workload="coding-agent",
                    conversations=level,
                    duration_s=cfg.duration_s,
                    warmup_s=cfg.warmup_s,
                    seed=cfg.seed,
                    scale=cfg.scale,
                    warm_start=True,
                    think_scale=cfg.think_scale * cfg.time_scale,
                )
                jobs = []
                for s in systems:
                    states[(level, s.name)] = state = LevelState(level)
                    live_cfg = LiveConfig(base_urls=s.targets(), system=s.name, **base)  # type: ignore[arg-type]
                    jobs.append(run_level(live_cfg, state, stop))
                ticker = asyncio.create_task(_refresh(live, cfg, names, states, done))
                try:
                    level_rows = await asyncio.gather(*jobs)
                finally:
                    ticker.cancel()
                done[0] = i + 1
                live.update(live_table(cfg, names, states, done[0]))
                rows += level_rows
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    return rows


async def _refresh(live: Live, cfg: DemoConfig, names: list[str], states: dict, done: list[int]) -> None:
    while True:
        live.update(live_table(cfg, names, states, done[0]))
        await asyncio.sleep(0.5)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> Path:
    """Run the demo; returns the report's index.html."""
    from loadtest.demo.fullscale import FullScale

    console = console or Console()
    t0 = time.monotonic()
    procs = Processes(cfg.report / "logs")
    full: FullScale | None = None
    rows: list[dict] = []
    try:
        names = ["direct", "gateway"] + (["sglang-router"] if cfg.sglang_router_python else [])
        console.print(
            f"starting {len(names)} x {cfg.backends} simulated SGLang servers (profile {cfg.profile}) and the gateway…"
        )
        with ThreadPoolExecutor(len(names)) as pool:
            twins = list(pool.map(lambda n: start_twins(cfg, procs, n), names))
        systems = [System(n, t) for n, t in zip(names, twins, strict=True)]
        if cfg.fullscale:
            full = FullScale(minutes=cfg.fullscale_minutes, cache=cfg.report / "fullscale-cache.json")
        console.print(f"ready in {time.monotonic() - t0:.1f} s")
        rows = asyncio.run(_sweep(cfg, procs, systems, console))
    finally:
        procs.stop_all()
        fullscale = None
        if full is not None:
            if rows:
                console.print(
                    f"live sweep done; full-scale simulations: {full.done()}/{len(full.work)} finished, "
                    f"waiting for the rest…"
                )
                fullscale = full.result()
            else:
                full.cancel()
    title = (
        f"cachegate demo: coding-agent (scale {cfg.scale}) on {cfg.backends} x {cfg.profile} per system, "
        f"{cfg.duration_s:g} s per level"
    )
    print_table(rows, title, console)
    v = verdict(rows)
    if v is not None:
        console.print(f"\n[bold]{v['sentence']}[/bold]\n")
    meta = {
        "wall_s": round(time.monotonic() - t0, 1),
        "config": _config_meta(cfg),
        "verdict": v,
        "processes": [{"name": n, "pid": p.pid, "returncode": p.returncode} for n, p in procs.procs],
    }
    index = write_demo_report(rows, cfg.report, title, meta=meta, fullscale=fullscale)
    console.print(f"demo finished in {time.monotonic() - t0:.0f} s; report: {index.resolve()}")
    return index


def _config_meta(cfg: DemoConfig) -> dict:
    return {
        "levels": cfg.levels,
        "duration_s": cfg.duration_s,
        "warmup_s": cfg.warmup_s,
        "backends": cfg.backends,
        "profile": cfg.profile,
        "scale": cfg.scale,
        "think_scale": cfg.think_scale,
        "seed": cfg.seed,
    }
