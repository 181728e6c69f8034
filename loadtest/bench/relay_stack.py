"""The relay benchmark's processes: start the upstream, gateways, routers and floor; measure a server's CPU and RSS."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

MODEL = "bench-model"
HERE = Path(__file__).resolve().parents[2]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(url)


@contextlib.contextmanager
def process(
    args: list[str], ready: str | None, cwd: Path = HERE, log: Path | None = None, cpus: set[int] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` as a child process (on ``cpus`` only, if given; its children inherit them), stopped at exit."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115  # closed below
    proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=out, preexec_fn=_on(cpus))
    try:
        if ready:
            _wait(ready, proc)
        else:
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if log:
            out.close()  # type: ignore[union-attr]


def _on(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that keeps the child on ``cpus`` (``--pin``)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return out


def cpu_seconds(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


@dataclass
class Target:
    name: str
    port: int
    pid: int


def measure(target: Target, load_args: list[str], cpus: set[int] | None = None) -> dict[str, Any]:
    """Run the load generator once against ``target``; the server's CPU and peak RSS over the run."""
    peak = [rss_mb(target.pid)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            peak[0] = max(peak[0], rss_mb(target.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    cpu0 = cpu_seconds(target.pid)
    sampler.start()
    out = subprocess.run(
        [sys.executable, "-m", "loadtest.bench.relay_load", *load_args, "--port", str(target.port)],
        cwd=HERE,
        capture_output=True,
        check=True,
        preexec_fn=_on(cpus),
    ).stdout
    stop.set()
    sampler.join()
    result: dict[str, Any] = orjson.loads(out)
    result["cpu_s"] = cpu_seconds(target.pid) - cpu0
    result["rss_mb"] = peak[0]
    return result


def gateway_config(path: Path, upstream: str, overrides: list[str] = ()) -> Path:  # type: ignore[assignment]
    """The benchmark's gateway config; ``overrides`` are ``dotted.key=YAML`` (e.g. ``overload.max_lag_ms=500``)."""
    cfg: dict[str, Any] = {
        "models": {MODEL: {"backends": [{"url": upstream, "name": "up"}]}},
        "teams": {"default": {"max_concurrency": 100_000, "max_queue": 100_000, "queue_timeout_s": 300}},
    }
    for item in overrides:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_upstream(stack: contextlib.ExitStack, interval: float, cpus: set[int] | None = None) -> str:
    """The synthetic upstream (one chunk per ``interval`` a stream) until ``stack`` closes: its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "loadtest.bench.relay_upstream", "--port", str(port), "--interval", str(interval)]
    stack.enter_context(process(cmd, url + "/health", cpus=cpus))
    return url


def serve_command(cfg: Path, port: int, policy: str = "gateway", workers: int = 1) -> list[str]:
    """``cachegate serve`` as the benchmarks run it."""
    return [
        *(sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)),
        *("--log-level", "warning", "--policy", policy, "--workers", str(workers)),
    ]


def start_router(
    stack: contextlib.ExitStack, upstream: str, cpus: set[int] | None = None, policy: str = "round_robin"
) -> Target | None:
    """sglang-router (``policy``) in front of ``upstream`` until ``stack`` closes; None if not installed."""
    if importlib.util.find_spec("sglang_router") is None:
        return None
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", upstream, "--policy", policy]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
    cmd += ["--prometheus-port", str(free_port())]  # not its default 29000: another router may hold it
    proc = stack.enter_context(process(cmd, f"http://127.0.0.1:{port}/health", cpus=cpus))
    return Target(f"sglang-router {policy}", port, proc.pid)


ROUTER_POLICIES = ("round_robin", "cache_aware")
FLOOR = "floor"
"""The short mode's floor (``--floor``, loadtest/bench/floor_proxy.py): the server and the upstream client alone."""


def start_floor(stack: contextlib.ExitStack, upstream: str, cpus: set[int] | None = None) -> Target:
    """loadtest/bench/floor_proxy.py in front of ``upstream`` until ``stack`` closes."""
    port = free_port()
    cmd = [sys.executable, "-m", "loadtest.bench.floor_proxy", "--upstream", upstream, "--port", str(port)]
    proc = stack.enter_context(process(cmd, f"http://127.0.0.1:{port}/", cpus=cpus))
    return Target(FLOOR, port, proc.pid)


def interpreter() -> str:
    """The Python the gateway, baseline and floor run on (this one: ``sys.executable``). Its build
    moves their CPU: docs/benchmarks.md, "The short request"."""
    with open("/proc/self/maps") as maps:
        shared = next((line.split()[-1] for line in maps if "/libpython" in line), None)
    build = f"libpython shared ({shared})" if shared else "libpython linked in"
    return f"Python {sys.version.split()[0]} at {os.path.realpath(sys.executable)}, {build}"
