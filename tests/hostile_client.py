"""The client's side of the hostile-upstream scenarios (tests/hostile_upstream.py): one request
through a gateway and the raw bytes it got, a ``/healthz`` watch, the worker's memory.

``python -m tests.hostile_client --checkout DIR`` runs every scenario through ``cachegate serve``
from that checkout and prints what the client got (the before/after table of docs/reliability.md,
"A hostile upstream").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import yaml

from tests.fake_upstream import free_port
from tests.hostile_upstream import CASES, SERVED, HostileUpstream, body_of


@dataclass
class Outcome:
    """What the client got for one request."""

    status: int
    body: bytes
    seconds: float

    def describe(self) -> str:
        """``502 upstream_malformed_response``, ``200 + error event upstream_timeout`` …"""
        if self.status == 0:
            return f"no answer ({self.body.decode(errors='replace')[:60]})"
        code = _error_code(self.body)
        if self.status == 200 and code:
            return f"200 + error event {code}"
        return f"{self.status} {code}" if code else f"{self.status} ({len(self.body)} bytes, not the answer)"


def _error_code(body: bytes) -> str:
    for raw in [body, *(ln[6:] for ln in body.split(b"\n") if ln.startswith(b"data: {"))]:
        with contextlib.suppress(orjson.JSONDecodeError):
            doc = orjson.loads(raw)
            error = doc.get("error") if isinstance(doc, dict) else None
            if isinstance(error, dict):
                return str(error.get("code") or error.get("type") or "error")
    return ""


def ask(client: httpx.Client, base: str, content: str, stream: bool, timeout: float = 20.0) -> Outcome:
    """One chat request through the gateway: the raw bytes the client got."""
    started = time.monotonic()
    payload = {"model": "kimi", "stream": stream, "messages": [{"role": "user", "content": content}]}
    try:
        with client.stream("POST", base + "/v1/chat/completions", json=payload, timeout=timeout) as response:
            body = b"".join(response.iter_raw())
            return Outcome(response.status_code, body, time.monotonic() - started)
    except httpx.HTTPError as exc:
        return Outcome(0, f"{type(exc).__name__}: {exc}".encode(), time.monotonic() - started)


def expected(stream: bool, content: str) -> bytes:
    """The exact bytes the client must get for a valid answer carrying ``content``."""
    return body_of(stream, content)


class HealthWatch:
    """Polls ``/healthz`` every 20 ms on a thread of its own: the slowest answer and the failures."""

    def __init__(self, base: str) -> None:
        self.base, self.slowest, self.failures, self.polls = base, 0.0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self, client: httpx.Client) -> None:
        started = time.monotonic()
        try:
            ok = client.get(self.base + "/healthz").status_code == 200
        except httpx.HTTPError:
            ok = False
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.polls += 1
        self.failures += not ok

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            self._poll(client)
            while not self._stop.wait(0.02):
                self._poll(client)
            self._poll(client)  # once more at the end: the worker still answers after what happened

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def rss_kib(pid: int) -> int:
    """The resident memory of ``pid`` (0 once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def gateway_config(path: Path, upstream_url: str, idle_timeout_s: float = 1.0) -> str:
    """One model on one backend, upstream idle timeout ``idle_timeout_s``."""
    config = {
        "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": upstream_url}]}},
        "health": {"interval_s": 0.5, "load_interval_s": 0.5},
        "policy": "direct",
        "upstream": {"idle_timeout_s": idle_timeout_s},
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@contextlib.contextmanager
def _gateway(checkout: str, cfg: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": checkout}
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", cfg, "--port", str(port)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                        break
                time.sleep(0.1)
            yield base, proc
        finally:
            proc.kill()
            proc.wait(10)


def _one(base: str, pid: int, name: str, stream: bool, timeout: float) -> tuple[str, HealthWatch]:
    """One scenario and the three requests after it, while a watchdog kills a gateway past 2 GiB."""
    rss = rss_kib(pid)
    with httpx.Client() as client, HealthWatch(base) as watch:
        stop = threading.Event()

        def watchdog() -> None:
            while not stop.wait(0.2):
                with contextlib.suppress(OSError):
                    if rss_kib(pid) > 2 << 20:
                        os.kill(pid, 9)

        threading.Thread(target=watchdog, daemon=True).start()
        try:
            got = ask(client, base, f"case:{name}", stream, timeout)
            peak = rss_kib(pid)
            own = sum(
                ask(client, base, f"after {name} {i}", stream, timeout).body == expected(stream, f"after {name} {i}")
                for i in range(3)
            )
        finally:
            stop.set()
    shown = "valid, exact" if got.body == expected(stream, f"case:{name}") else got.describe()
    slowest = f"{watch.slowest * 1000:.0f} ms" + (f" ({watch.failures} failed)" if watch.failures else "")
    grew = max(peak, rss_kib(pid)) - rss
    mode = "stream" if stream else "whole"
    return f"| {name} | {mode} | {shown} | {got.seconds:.1f} | {slowest} | {own}/3 | {grew / 1024:.1f} |", watch


def main() -> None:
    """The before/after table: every scenario through a gateway run from ``--checkout`` (restarted
    after a scenario that froze or killed it)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--checkout", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--timeout", type=float, default=10.0, help="client timeout per request")
    args = parser.parse_args()
    with HostileUpstream().running() as up, tempfile.TemporaryDirectory() as tmp:
        cfg = gateway_config(Path(tmp) / "c.yaml", up.url)
        print(f"checkout {args.checkout}")
        print("| malformation | mode | client got | s | healthz slowest | next 3 own bytes | RSS +MiB |")
        print("|---|---|---|---|---|---|---|")
        todo = [(name, stream) for name in CASES for stream in (False, True)]
        while todo:
            with _gateway(args.checkout, cfg) as (base, proc):
                while todo:
                    name, stream = todo.pop(0)
                    row, watch = _one(base, proc.pid, name, stream, args.timeout)
                    print(row, flush=True)
                    if watch.failures or proc.poll() is not None:
                        print(f"| (gateway {'died' if proc.poll() is not None else 'stopped answering'}: restarted) |")
                        break


if __name__ == "__main__":
    main()
