"""Workers scaling under a CPU quota: 1 worker against 2 workers with Redis, each worker on a fixed share of CPU.

    cachegate bench --scaling --cpu-quota 0.4 [--rounds 2] [--short-seconds 8] [--short-connections 64]

On a 2-core machine the load generator, the synthetic upstream and Redis compete with the gateway's
workers, so "two workers on two cores" cannot be run as such. Instead every worker process goes into
a cgroup of its own (cgroup v1 ``cpu`` controller, ``cpu.cfs_quota_us``) capped at ``--cpu-quota``
CPUs: one worker gets q, two workers get q each (2q), and the rest of the machine is left to the
client, the upstream and Redis. Closed-loop short requests (each connection sends its next request
when the last is answered; ``--short-connections`` per worker, so every worker has the same queue)
then measure requests/s for 1 worker without Redis, 1 worker with Redis
and 2 workers with Redis, alternated ``--rounds`` times, with each worker's CPU as a share of its
quota (about 100%: the workers, not the client, are the bottleneck) and the periods it was throttled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from loadtest.bench.procs import free_port, process

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
SHARES = 8192  # eight ordinary processes' weight (1024 each)


class CgroupUnavailable(RuntimeError):
    """The cgroup v1 ``cpu`` controller is not mounted writable here; ``--cpu-quota`` cannot be applied."""


@dataclass
class Cgroup:
    path: Path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttled(self) -> int:
        """Periods in which the group used its whole quota and had to wait."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "nr_throttled":
                return int(value)
        return 0


@contextlib.contextmanager
def cpu_limit(name: str, cpus: float | None, shares: int = SHARES, root: Path = CGROUP_CPU) -> Iterator[Cgroup]:
    """A cgroup capped at ``cpus`` CPUs (``cpus`` × the period per period; None: no cap) with
    ``shares``: a weight of several ordinary processes, so the benchmark gets its CPU on a machine
    other work keeps busy. Removed on exit (a process still in it is moved back to the root)."""
    if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
        raise CgroupUnavailable(f"{root} is not a writable cgroup v1 cpu controller: cannot apply a CPU quota")
    path = root / f"{name}-{os.getpid()}"
    path.mkdir()
    try:
        (path / "cpu.shares").write_text(str(shares))
        if cpus is not None:
            (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (path / "cpu.cfs_quota_us").write_text(str(max(1000, round(cpus * PERIOD_US))))
        yield Cgroup(path)
    finally:
        for _ in range(50):
            left = (path / "cgroup.procs").read_text().split()
            for pid in left:
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
            try:
                path.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            kids += [int(k) for k in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return kids


def workers_of(pid: int, expected: int, timeout: float = 30) -> list[int]:
    """The worker processes of ``cachegate serve`` at ``pid``: itself with one worker, else its
    ``expected`` spawned children (uvicorn's supervisor stays outside the quota: it only watches)."""
    if expected == 1:
        return [pid]
    deadline = time.monotonic() + timeout
    while True:
        found = [k for k in _children(pid) if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]
        if len(found) == expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    label: str
    rps: list[float] = field(default_factory=list)
    errors: int = 0
    at_quota: list[list[float]] = field(default_factory=list)  # per round: each worker's CPU / its quota
    throttled: list[int] = field(default_factory=list)


def _gateway_cmd(config: Path, port: int, workers: int, redis_url: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
    cmd += ["--log-level", "warning", "--workers", str(workers)]
    return cmd + (["--redis-url", redis_url] if redis_url else [])


def _load(port: int, connections: int, seconds: float, cwd: Path) -> dict[str, object]:
    args = ["short", "--port", str(port), "--connections", str(connections), "--seconds", str(seconds)]
    out = subprocess.run(
        [sys.executable, "-m", "loadtest.bench.relay_load", *args, "--rate", "0"],
        cwd=cwd,
        capture_output=True,
        check=True,
    ).stdout
    result: dict[str, object] = orjson.loads(out)
    return result


def run_one(
    result: Result,
    config: Path,
    workers: int,
    redis_url: str | None,
    quota: float | None,
    connections: int,
    seconds: float,
    cwd: Path,
) -> None:
    """One gateway (``workers`` processes, each in a cgroup of ``quota`` CPUs), warmed up, then one
    closed-loop run of ``seconds`` from ``connections`` per worker (the same queue at every worker)."""
    connections *= workers
    port = free_port()
    cmd = _gateway_cmd(config, port, workers, redis_url)
    with contextlib.ExitStack() as stack:
        proc = stack.enter_context(process(cmd, cwd=str(cwd), ready=f"http://127.0.0.1:{port}/readyz"))
        pids = workers_of(proc.pid, workers)
        if len(pids) != workers:
            raise RuntimeError(f"expected {workers} worker processes under {proc.pid}, found {pids}")
        groups = []
        if quota is not None:
            for i, pid in enumerate(pids):
                group = stack.enter_context(cpu_limit(f"cachegate-bench-w{i}", quota))
                group.add(pid)
                groups.append(group)
        _load(port, connections, 1.5, cwd)  # warm up: lazy imports, pools, the Redis scripts loaded
        cpu0 = [cpu_seconds(p) for p in pids]
        thr0 = [g.throttled() for g in groups]
        t0 = time.monotonic()
        out = _load(port, connections, seconds, cwd)
        wall = time.monotonic() - t0
        used = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
        completed = int(out["completed"])  # type: ignore[call-overload]
        result.rps.append(completed / float(out["wall_s"]))  # type: ignore[arg-type]
        result.errors += sum(out["errors"].values())  # type: ignore[attr-defined]
        result.at_quota.append([u / ((quota or 1.0) * wall) for u in used])  # no quota: share of one CPU
        if quota is not None:
            result.throttled.append(sum(g.throttled() - t for g, t in zip(groups, thr0, strict=True)))


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of its own on a free port (no persistence), so a run counts only its own traffic."""
    port, folder = free_port(), tempfile.mkdtemp(prefix="cg-bench-redis-")
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    try:
        with process([*args, "--dir", folder]):
            time.sleep(0.3)
            yield f"redis://127.0.0.1:{port}/0"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def scaling(
    config: Path, redis_url: str | None, quota: float | None, rounds: int, connections: int, seconds: float, cwd: Path
) -> list[Result]:
    """1 worker without Redis, 1 and 2 workers with Redis, alternated ``rounds`` times; prints the table."""
    quota_text = f"each worker capped at {quota:g} CPU (cgroup)" if quota else "no CPU quota"
    print(
        f"workers scaling: closed loop, {connections} keep-alive connections per worker, {seconds:g} s per run, "
        f"{rounds} round(s) alternated, {quota_text}; {os.cpu_count()} cores; load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + "\n"
    )
    results = [Result("1 worker, no Redis"), Result("1 worker, Redis"), Result("2 workers, Redis")]
    with contextlib.ExitStack() as stack:
        if quota is not None:  # the client, upstream, Redis and gateway supervisor: weighted, not capped
            rest = stack.enter_context(cpu_limit("cachegate-bench-rest", None))
            for pid in [os.getpid(), *_children(os.getpid())]:  # the upstream is already running
                rest.add(pid)
        url = redis_url or stack.enter_context(private_redis())
        for _ in range(rounds):
            for res, (workers, use_redis) in zip(results, ((1, False), (1, True), (2, True)), strict=True):
                run_one(res, config, workers, url if use_redis else None, quota, connections, seconds, cwd)
    share = "CPU / quota" if quota else "CPU (of one core)"
    print(f"| gateway | requests/s (each round) | mean | errors | each worker's {share} | throttled periods |")
    print("|---|---|---|---|---|---|")
    for r in results:
        busy = "; ".join("+".join(f"{x:.0%}" for x in round_) for round_ in r.at_quota)
        print(
            f"| {r.label} | {' '.join(f'{x:.0f}' for x in r.rps)} | {sum(r.rps) / len(r.rps):.0f} | {r.errors} | "
            f"{busy} | {' '.join(str(t) for t in r.throttled) or '-'} |"
        )
    mean = [sum(r.rps) / len(r.rps) for r in results]
    print(
        f"\n2 workers with Redis / 1 worker with Redis = {mean[2] / mean[1]:.2f}x; "
        f"/ 1 worker without Redis = {mean[2] / mean[0]:.2f}x; load average after: "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        flush=True,
    )
    return results
