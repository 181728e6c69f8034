"""Instructions per short request, counted by valgrind's callgrind: repeatable whatever else the machine
does, where CPU time moves between rounds by more than the differences sought (the rounds' range in
docs/benchmarks.md, "The short request"). Instructions are not time (a request that walks cold memory costs
more than its count says), so this decides between versions of one path, and ``cachegate bench``
says what the machine makes of them.

    python -m loadtest.bench.instr [--source DIR ...] [--floor] [--requests N] [--rate R]

For each ``--source`` checkout (default: this one), the synthetic upstream, then ``cachegate serve``
(one worker, in memory) under ``valgrind --tool=callgrind``; 300 requests to warm it, the counters
zeroed, ``N`` short requests at ``R`` requests/s on 4 keep-alive connections (valgrind runs the
server many times slower: keep R low), the counters dumped. Then the same time with no requests: what the
worker's timers and polls cost a second. Printed per server: instructions per request as measured,
the idle rate, and per request net of it, plus per request at 400 requests/s (the benchmark's rate),
where the background is spread over ten times as many requests. ``--floor``: loadtest/bench/floor_proxy.py
too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from loadtest.bench.procs import wait_ready
from loadtest.bench.relay_stack import free_port, gateway_config, serve_command, start_upstream

HERE = Path(__file__).resolve().parents[2]
BENCH_RATE = 400.0


def _load(port: int, requests: int, rate: float) -> int:
    cmd = [sys.executable, "-m", "loadtest.bench.relay_load", "short", "--port", str(port), "--connections", "4"]
    cmd += ["--seconds", f"{requests / rate:g}", "--rate", f"{rate:g}"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, check=True).stdout
    return int(orjson.loads(out)["completed"])


def _total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"no totals in {dump}")


def measure(
    cmd: list[str], ready: str, port: int, cwd: Path, requests: int, rate: float, tmp: Path
) -> dict[str, float]:
    """Instructions of ``requests`` requests and of as long without any, in one callgrind run of ``cmd``."""
    out = tmp / f"callgrind.{port}"
    grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", "--dump-instr=no", *cmd]
    env = dict(os.environ, PYTHONPATH=str(cwd))
    proc = subprocess.Popen(grind, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(ready, timeout=300)
        _load(port, 300, rate)

        def counted(load: bool) -> tuple[int, int, float]:
            """Instructions, requests and seconds of one window (``load``: with the requests)."""
            for stale in tmp.glob(f"callgrind.{port}.*"):
                stale.unlink()
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], capture_output=True, check=True)
            started = time.monotonic()
            done = _load(port, requests, rate) if load else 0
            if not load:
                time.sleep(requests / rate)
            seconds = time.monotonic() - started
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True, check=True)
            time.sleep(1)
            dumps = sorted(tmp.glob(f"callgrind.{port}.*"), key=lambda p: p.stat().st_mtime)
            return _total(dumps[-1]), done, seconds

        busy, done, _ = counted(True)
        idle, _, seconds = counted(False)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        if proc.poll() is None:
            proc.kill()
    per_request = busy / max(1, done)
    idle_per_s = idle / seconds
    net = per_request - idle_per_s / rate
    return {"per_request": per_request, "idle_per_s": idle_per_s, "net": net, "at_400": net + idle_per_s / BENCH_RATE}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", action="append", type=Path, help="a checkout to measure (repeatable)")
    parser.add_argument("--floor", action="store_true", help="measure loadtest/bench/floor_proxy.py too")
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--rate", type=float, default=40.0)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        parser.error("needs valgrind (apt-get install valgrind)")
    sources = [s.resolve() for s in args.source or [HERE]]
    print(f"instructions (callgrind) per short request: {args.requests} at {args.rate:g}/s, one worker, in memory\n")
    print("| server | per request | idle, per second | per request net of idle | per request at 400/s |")
    print("|---|---|---|---|---|")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-instr-")))
        upstream = start_upstream(stack, 0.1)
        cfg = gateway_config(tmp / "gateway.yaml", upstream)
        servers: list[tuple[str, list[str], str, int, Path]] = []
        for src in sources:
            port = free_port()
            servers.append((str(src), serve_command(cfg, port), f"http://127.0.0.1:{port}/readyz", port, src))
        if args.floor:
            port = free_port()
            cmd = [sys.executable, "-m", "loadtest.bench.floor_proxy", "--upstream", upstream, "--port", str(port)]
            servers.append(("floor", cmd, f"http://127.0.0.1:{port}/", port, HERE))
        for name, cmd, ready, port, cwd in servers:
            r = measure(cmd, ready, port, cwd, args.requests, args.rate, tmp)
            print(
                f"| {name} | {r['per_request'] / 1e3:.1f}k | {r['idle_per_s'] / 1e6:.2f}M | {r['net'] / 1e3:.1f}k | "
                f"{r['at_400'] / 1e3:.1f}k |",
                flush=True,
            )


if __name__ == "__main__":
    main()
