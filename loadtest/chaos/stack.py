"""The processes a chaos or soak run drives: a private Redis, twins behind fault proxies, gateway replicas.

Every process is started here on a free loopback port and stopped by ``Stack.close`` (also after
a failure); twins and replicas can be killed and started again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from backends.sim.testing import free_port
from loadtest.chaos.proxy import FaultProxy, Meter

ADMIN = "chaos-admin"
TEAMS = {"a": "key-a", "b": "key-b"}


@dataclass
class Proc:
    cmd: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None
    log: Any = None

    def start(self, env: dict[str, str] | None = None) -> None:
        self.log = self.log or tempfile.TemporaryFile()  # noqa: SIM115 (closed with the process)
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(5)
        self.proc = None


@dataclass
class Stack:
    twins: int = 2
    replicas: int = 2
    time_scale: float = 0.05
    limit: int = 4
    lease_ttl_s: float = 5.0
    redis: bool = True
    header_timeout_s: float = 5.0
    extra_config: str = ""
    redis_port: int = field(default_factory=free_port)
    redis_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="cg-chaos-"))
    meter: Meter = field(default_factory=Meter)
    twin_procs: list[Proc] = field(default_factory=list)
    proxies: list[FaultProxy] = field(default_factory=list)
    replica_procs: list[Proc] = field(default_factory=list)
    redis_proc: Proc | None = None

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p.port}" for p in self.replica_procs]

    async def start(self) -> None:
        if self.redis:
            self.redis_proc = Proc(
                [
                    "redis-server",
                    "--port",
                    str(self.redis_port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self.redis_dir,
                ],
                self.redis_port,
            )
            self.start_redis()
        for _ in range(self.twins):
            port = free_port()
            twin = Proc(
                [
                    sys.executable,
                    "-m",
                    "backends.sim.cli",
                    "--profile",
                    "tiny",
                    "--port",
                    str(port),
                    "--time-scale",
                    str(self.time_scale),
                    "--abort-delay",
                    "0.2",
                ],
                port,
            )
            twin.start()
            self.twin_procs.append(twin)
            proxy = FaultProxy(port, free_port(), self.meter)
            await proxy.start()
            self.proxies.append(proxy)
        for twin in self.twin_procs:
            await wait_http(f"http://127.0.0.1:{twin.port}/health")
        config = os.path.join(self.redis_dir, "cachegate.yaml")
        with open(config, "w") as f:
            f.write(self._config())
        for _ in range(self.replicas):
            port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--config",
                config,
                "--port",
                str(port),
                *(a for team, key in TEAMS.items() for a in ("--api-key", f"{key}={team}")),
            ]
            if self.redis:
                cmd += ["--redis-url", self.redis_url]
            self.replica_procs.append(Proc(cmd, port))
        for replica in self.replica_procs:
            self.start_replica(replica)
        for url in self.urls:
            await wait_http(url + "/readyz", timeout=30)

    def _config(self) -> str:
        backends = ", ".join(f'{{name: b{i}, url: "{p.url}"}}' for i, p in enumerate(self.proxies))
        teams = "\n".join(
            f"  {t}: {{max_concurrency: {self.limit}, max_queue: 64, queue_timeout_s: 20}}" for t in TEAMS
        )
        return (
            f"models:\n  m: {{upstream_model: moonshotai/Kimi-K2-Instruct, backends: [{backends}]}}\n"
            f"teams:\n{teams}\nlease_ttl_s: {self.lease_ttl_s}\nlog_level: warning\n"
            "health: {interval_s: 0.5, timeout_s: 1.0, failures_to_eject: 2, load_interval_s: 1.0}\n"
            "upstream: {idle_timeout_s: 10, connect_timeout_s: 1}\n"
            f"server: {{header_timeout_s: {self.header_timeout_s}, body_timeout_s: 20, body_idle_timeout_s: 5}}\n"
            # Seat holds scaled like the twins' time (30 s and 20 s of engine time at 0.05): else the
            # load's many short conversations fill the seats for 30 wall seconds.
            f"admission: {{idle_release_s: {30 * self.time_scale:g}, min_hold_s: {20 * self.time_scale:g}}}\n"
            + self.extra_config
        )

    def start_redis(self) -> None:
        assert self.redis_proc is not None
        self.redis_proc.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.redis_port), 0.2):
                return
            time.sleep(0.05)

    def start_replica(self, replica: Proc) -> None:
        replica.start({"CACHEGATE_ADMIN_TOKEN": ADMIN})

    def restart_twin(self, i: int) -> None:
        self.twin_procs[i].start()

    def log_count(self, needle: bytes) -> int:
        """Lines of the replicas' logs (every life of each) that contain ``needle``."""
        total = 0
        for replica in self.replica_procs:
            if replica.log is not None:
                replica.log.seek(0)
                total += sum(1 for line in replica.log.read().splitlines() if needle in line)
        return total

    async def close(self) -> None:
        for proc in [*self.replica_procs, *self.twin_procs, *([self.redis_proc] if self.redis_proc else [])]:
            proc.stop()
        for proxy in self.proxies:
            await proxy.stop()
        shutil.rmtree(self.redis_dir, ignore_errors=True)

    # ----- what the replicas and Redis say ------------------------------------------------------

    async def admin_state(self, client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = await client.get(url + "/admin/state", headers={"authorization": f"Bearer {ADMIN}"}, timeout=2)
            return dict(r.json()) if r.status_code == 200 else None
        return None

    async def readyz(self, client: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            return dict((await client.get(url + "/readyz", timeout=2)).json())
        return None

    def leases(self) -> int | None:
        """Leases left in Redis held by live replicas (all teams), or None when Redis is down."""
        import redis

        from gateway.state.redis_scripts import live_leases

        try:
            return sum(live_leases(self.redis_url).values())
        except (redis.RedisError, OSError):
            return None

    def pids(self) -> list[int]:
        return [p.proc.pid for p in self.replica_procs if p.proc is not None]


async def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url, timeout=1)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def proc_stats(pid: int) -> tuple[float, int]:
    """(RSS in MB, open fds) of a process."""
    rss = 0.0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    fds = 0
    with contextlib.suppress(OSError):
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds
