"""Start twins for tests and demos: in-process (a uvicorn thread) or as a subprocess.

    from backends.sim.testing import run_twin, run_twins, spawn_twin

    with run_twin("tiny", time_scale=0.05, abort_delay_s=0.2) as url:   # http://127.0.0.1:PORT
        httpx.post(f"{url}/v1/chat/completions", json={...})

    with run_twins(4, "tiny", time_scale=0.1) as urls: ...             # four servers

    with spawn_twin("tiny", time_scale=0.1) as url: ...                # `cachegate sim-backend` process

Each helper picks a free loopback port, waits until ``/health`` answers 200 and stops the server
when the block ends. ``twin_of(url)`` gives the in-process :class:`Twin` behind a URL (for white-box
checks such as the engine's counters).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import httpx
import uvicorn

from backends.sim.serve import uvicorn_config
from backends.sim.server import Twin, create_app

_TWINS: dict[str, Twin] = {}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(
    url: str,
    timeout: float = 15.0,
    proc: subprocess.Popen[bytes] | None = None,
    log: IO[bytes] | None = None,
    verify: str | bool = True,
) -> None:
    """Poll ``url/health`` until 200 (raises on timeout or if ``proc`` exits); ``verify``: a CA file for HTTPS."""
    deadline = time.monotonic() + timeout
    last: object = None
    tls_context = ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = ""
            if log is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"twin process exited with {proc.returncode}: {err}")
        try:
            r = httpx.get(f"{url}/health", timeout=1.0, verify=tls_context)
            if r.status_code == 200:
                return
            last = r.status_code
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.02)
    raise TimeoutError(f"twin at {url} not ready after {timeout}s (last: {last!r})")


def twin_of(url: str) -> Twin:
    """The in-process twin serving ``url`` (only for twins started by :func:`run_twin`)."""
    return _TWINS[url.rstrip("/")]


@contextlib.contextmanager
def run_twin(
    profile: Any = "tiny",
    *,
    port: int | None = None,
    ready_timeout: float = 15.0,
    wait: bool = True,
    tls: tuple[str, str, str] | None = None,
    **app_kwargs: Any,
) -> Iterator[str]:
    """Serve a twin from a background thread of this process; yields its base URL.

    ``wait=False`` yields as soon as the port listens, without waiting for ``/health`` (200).
    ``tls``: (certificate chain, key, CA) PEM files: the twin serves HTTPS (``https://127.0.0.1:PORT``).
    """
    app = create_app(profile, **app_kwargs)
    for attempt in range(5):
        p = port or free_port()
        server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", p, tls=tls[:2] if tls else None))
        thread = threading.Thread(target=server.run, name=f"twin-{p}", daemon=True)
        thread.start()
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        if server.started:
            break
        thread.join(timeout=5)
        if port is not None or attempt == 4:
            raise RuntimeError(f"twin could not bind port {p}")
    url = f"{'https' if tls else 'http'}://127.0.0.1:{p}"
    _TWINS[url] = app.state.twin
    try:
        if wait:
            wait_ready(url, ready_timeout, verify=tls[2] if tls else True)
        yield url
    finally:
        _TWINS.pop(url, None)
        server.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():  # a stuck stream: force the close
            server.force_exit = True
            thread.join(timeout=5)


@contextlib.contextmanager
def run_twins(n: int, profile: Any = "tiny", **kw: Any) -> Iterator[list[str]]:
    """``n`` in-process twins with the same settings; yields their URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_twin(profile, **kw)) for _ in range(n)]


class SpawnedTwin(str):
    """A twin's base URL that also holds its process (tests kill it to simulate a crash)."""

    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def spawn_twin(
    profile: str = "tiny",
    *,
    time_scale: float = 1.0,
    port: int | None = None,
    extra_args: list[str] | None = None,
    ready_timeout: float = 30.0,
) -> Iterator[SpawnedTwin]:
    """Run ``cachegate sim-backend`` in a subprocess; yields its base URL and terminates it at exit."""
    p = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "backends.sim.cli",
        "--profile",
        profile,
        "--port",
        str(p),
        "--time-scale",
        str(time_scale),
        *(extra_args or []),
    ]
    url = SpawnedTwin(f"http://127.0.0.1:{p}")
    # A file, not a pipe: a chatty child can never block on it.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        url.proc = proc
        try:
            wait_ready(url, ready_timeout, proc, log)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
