"""Steady-state CPU per relayed chunk: user and system time of the gateway's worker while N long
streams run, no stream opening or closing in the window.

    python -m loadtest.bench.steady [--streams 1000] [--tokens 200] [--window 10] [--baseline DIR]
                                    [--router]

Starts the synthetic upstream (loadtest/bench/relay_upstream.py), the gateway (this checkout; one worker;
``--baseline DIR``: also another checkout's, for before/after in one run) and, with ``--router``,
sglang-router, then per server: opens N streams of K chunks (one every ``--interval``), waits until
every stream is open (the ramp plus 3 s), samples utime and stime of the server's process tree from
/proc over ``--window`` seconds, and divides by the chunks relayed in it (N × window / interval:
every stream is in mid-flight for the whole window). Also prints what the load generator saw
(completed streams, transit p50/p99 over the whole run).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from loadtest.bench.relay_stack import (
    HERE,
    free_port,
    gateway_config,
    process,
    serve_command,
    start_router,
    start_upstream,
    tree,
)


def _times(pid: int) -> tuple[float, float]:
    user = system = 0
    for p in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--router", action="store_true")
    args = parser.parse_args()
    ramp = max(0.5, args.streams / 1000)
    if ramp + 3 + args.window > args.tokens * args.interval:
        parser.error("the streams end before the window does: more --tokens")
    py = sys.executable
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-steady-")))
        upstream = start_upstream(stack, args.interval)
        cfg = gateway_config(tmp / "gateway.yaml", upstream)
        targets: list[tuple[str, int, int]] = []
        for name, src in [("cachegate", HERE)] + ([("baseline", args.baseline.resolve())] if args.baseline else []):
            port = free_port()
            proc = stack.enter_context(process(serve_command(cfg, port), f"http://127.0.0.1:{port}/readyz", cwd=src))
            targets.append((name, port, proc.pid))
        router = start_router(stack, upstream) if args.router else None
        if router is not None:
            targets.append((router.name, router.port, router.pid))
        print(
            f"{args.streams} streams × {args.tokens} chunks, one every {args.interval * 1000:.0f} ms; "
            f"window {args.window:.0f} s\n"
        )
        print("| server | completed | CPU/chunk µs | user µs | sys µs | transit p50 / p99 ms |")
        print("|---|---|---|---|---|---|")
        for name, port, pid in targets:
            timeout = ramp + args.tokens * args.interval * 3 + 30
            load = subprocess.Popen(
                [
                    *(py, "-m", "loadtest.bench.relay_load", "streams", "--port", str(port)),
                    *("--streams", str(args.streams), "--tokens", str(args.tokens)),
                    *("--ramp", str(ramp), "--timeout", str(timeout)),
                ],
                cwd=HERE,
                stdout=subprocess.PIPE,
            )
            time.sleep(ramp + 3)
            u0, s0 = _times(pid)
            time.sleep(args.window)
            u1, s1 = _times(pid)
            out, _ = load.communicate()
            r = orjson.loads(out)
            chunks = args.streams * args.window / args.interval
            user, system = (u1 - u0) / chunks * 1e6, (s1 - s0) / chunks * 1e6
            print(
                f"| {name} | {r['completed']} | {user + system:.1f} | {user:.1f} | {system:.1f} | "
                f"{r['transit_p50_ms']} / {r['transit_p99_ms']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
