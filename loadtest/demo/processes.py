"""The demo's child processes: free ports, starting and stopping them by pid, waiting until they answer."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Processes:
    """Child processes this demo started; ``stop`` / ``stop_all`` end exactly those."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(
        self, name: str, args: list[str], python: str = sys.executable, module: str = "gateway.cli"
    ) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [python, "-m", module, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    @staticmethod
    def stop(procs: list[subprocess.Popen]) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 5
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait(5)

    def stop_all(self) -> None:
        self.stop([p for _, p in self.procs])


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


def flush(urls: list[str], timeout_s: float = 30.0) -> None:
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
