"""Start and stop real processes for tests: the gateway CLI on a free port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx

from tests.fake_upstream import free_port

ROOT = Path(__file__).resolve().parent.parent
CACHEGATE = [sys.executable, "-m", "gateway.cli"]


def wait_http(
    url: str, timeout: float = 20.0, ok: tuple[int, ...] = (200,), proc: subprocess.Popen | None = None
) -> httpx.Response:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            response = httpx.get(url, timeout=1.0)
            if response.status_code in ok:
                return response
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout}s ({last})")


class Running(str):
    """A base URL that also knows the process serving it, and what it has printed so far."""

    pid: int
    log: IO[bytes]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


@contextlib.contextmanager
def run_gateway(
    *args: str, env: dict[str, str] | None = None, ready_path: str = "/readyz", port: int | None = None
) -> Iterator[Running]:
    """Run ``cachegate serve ARGS`` and yield its base URL; always stop it."""
    port = port or free_port()
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    # A file, not a pipe: nobody drains a pipe while the test runs, and one access-log line per
    # request would fill it and block the gateway.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [*CACHEGATE, "serve", "--port", str(port), *args],
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = Running(f"http://127.0.0.1:{port}")
        base.pid, base.log = proc.pid, log
        try:
            wait_http(base + ready_path, proc=proc)
            yield base
        except BaseException:
            stop(proc)
            log.seek(0)
            print(log.read().decode(errors="replace")[-4000:])
            raise
        finally:
            stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
