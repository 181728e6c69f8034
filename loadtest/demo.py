"""`cachegate demo`: simulated backends + the gateway as local processes, a short sweep through
the gateway and straight to the backends, a table and a report folder.

Every process it starts is stopped on the way out (normal end, error or Ctrl-C), by its own pid.
Each level of each system starts cold (the backends' caches are flushed first) and a level uses
the same seed for both systems, with a different seed per level, so the gateway never carries
stale knowledge of a conversation from an earlier level.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console

from loadtest.client import LiveConfig, sweep
from loadtest.report import print_table, write_report

MODEL = "kimi-k2"
SCALE = 0.032
"""Token scale for the ``tiny`` profile: 250k-token conversations become ~8k."""
THINK_SCALE = 0.25


@dataclass
class DemoConfig:
    report: Path = Path("cachegate-report")
    levels: list[int] = field(default_factory=lambda: [8, 16, 32])
    duration_s: float = 20.0
    backends: int = 4
    time_scale: float = 1.0
    think_scale: float = THINK_SCALE
    seed: int = 1
    startup_timeout_s: float = 30.0
    show_progress: bool = True
    sglang_router_python: str | None = None
    """A Python with ``sglang-router`` installed: adds SGLang's own router (``cache_aware``) in front of
    the same backends as a third system (``pip install sglang-router`` in another virtualenv)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Processes:
    """Child processes this demo started; ``stop_all`` ends exactly those."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], python: str = sys.executable, module: str = "gateway.cli"
              ) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen([python, "-m", module, *args], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop_all(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for _, p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait(5)


def wait_ready(procs: Processes, name: str, proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{procs.log_tail(name)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready at {url} after {timeout_s:.0f} s:\n{procs.log_tail(name)}")


def flush(urls: list[str], timeout_s: float = 20.0) -> None:
    """Empty every backend's cache (SGLang answers 400 while requests are still running)."""
    for url in urls:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(f"{url}/flush_cache", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url}/flush_cache kept failing for {timeout_s:.0f} s")
            time.sleep(0.2)


def start_stack(cfg: DemoConfig, procs: Processes) -> tuple[list[str], str]:
    """Start the twins and the gateway; returns (backend URLs, gateway URL) once all are ready."""
    twins = []
    for i in range(cfg.backends):
        port = free_port()
        name = f"backend{i}"
        proc = procs.start(name, ["sim-backend", "--profile", "tiny", "--port", str(port), "--time-scale",
                                  str(cfg.time_scale), "--model", MODEL])
        twins.append((name, proc, f"http://127.0.0.1:{port}"))
    for name, proc, url in twins:
        wait_ready(procs, name, proc, f"{url}/health", cfg.startup_timeout_s)
    urls = [url for _, _, url in twins]
    port = free_port()
    args = ["serve", "--model", MODEL, "--port", str(port), "--host", "127.0.0.1"]
    for url in urls:
        args += ["--backend", url]
    gw = procs.start("gateway", args)
    gateway = f"http://127.0.0.1:{port}"
    wait_ready(procs, "gateway", gw, f"{gateway}/readyz", cfg.startup_timeout_s)
    return urls, gateway


def start_sglang_router(cfg: DemoConfig, procs: Processes, urls: list[str]) -> str:
    """SGLang's router (``cache_aware``, its launcher's defaults) in front of the same backends."""
    assert cfg.sglang_router_python
    port, metrics = free_port(), free_port()
    proc = procs.start("sglang-router", ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                                         "--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                                         "--prometheus-port", str(metrics), "--log-level", "warn"],
                       python=cfg.sglang_router_python, module="sglang_router.launch_router")
    router = f"http://127.0.0.1:{port}"
    wait_ready(procs, "sglang-router", proc, f"{router}/readiness", cfg.startup_timeout_s)
    return router


def run_demo(cfg: DemoConfig, console: Console | None = None) -> Path:
    """Run the demo; returns the report's index.html."""
    console = console or Console()
    t0 = time.monotonic()
    procs = Processes(cfg.report / "logs")
    rows: list[dict] = []
    try:
        console.print(f"starting {cfg.backends} simulated SGLang backends (tiny) and the gateway…")
        urls, gateway = start_stack(cfg, procs)
        console.print(f"ready in {time.monotonic() - t0:.1f} s: gateway {gateway}, backends {', '.join(urls)}")
        systems = [("gateway", [gateway]), ("direct", urls)]
        if cfg.sglang_router_python:
            systems.insert(1, ("sglang-router", [start_sglang_router(cfg, procs, urls)]))
        base = dict(model=MODEL, workload="coding-agent", duration_s=cfg.duration_s, seed=cfg.seed,
                    scale=SCALE, think_scale=cfg.think_scale * cfg.time_scale)
        for system, targets in systems:
            live = LiveConfig(base_urls=targets, system=system, **base)  # type: ignore[arg-type]
            done = asyncio.run(sweep(live, cfg.levels, show_progress=cfg.show_progress,
                                     on_level=lambda _c: flush(urls), vary_seed=True))
            rows += done
            if any(r.get("interrupted") for r in done):
                break
    finally:
        procs.stop_all()
    title = (f"cachegate demo: coding-agent (scale {SCALE}) on {cfg.backends} x tiny, "
             f"{cfg.duration_s:g} s per level")
    print_table(rows, title, console)
    meta = {"wall_s": round(time.monotonic() - t0, 1),
            "processes": [{"name": n, "pid": p.pid, "returncode": p.returncode} for n, p in procs.procs]}
    index = write_report(rows, cfg.report, title, meta=meta)
    console.print(f"demo finished in {time.monotonic() - t0:.0f} s; report: {index.resolve()}")
    return index
