"""The relay benchmark runs end to end (tiny: 30 streams, 20 ms chunks, a second of short requests with
the floor beside the gateway) and counts what it relayed."""

from __future__ import annotations

import subprocess
import sys

from tests.harness import ROOT


def test_bench_relay_smoke() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "bench",
            "--streams",
            "30",
            "--tokens",
            "5",
            "--interval",
            "0.02",
            "--no-router",
            "--short-seconds",
            "1",
            "--short-rate",
            "50",
            "--floor",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 30 | cachegate")]
    assert len(rows) == 1, out
    completed, errors, per_chunk = rows[0][2].strip(), rows[0][3].strip(), float(rows[0][5])
    assert completed == "30" and errors == "0" and per_chunk > 0, out
    short = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| cachegate |")]
    assert short and int(short[0][1]) >= 30 and short[0][2].strip() == "0", out
    # the floor ran the same short requests, and the gateway's ratio to it is printed
    floor = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| floor |")]
    assert floor and int(floor[0][1]) == int(short[0][1]) and floor[0][2].strip() == "0", out
    assert "× floor" in out and float(short[0][6].split()[0]) > 0, out
    # which interpreter the servers ran on (its build moves their CPU)
    assert f"gateway, baseline and floor on Python {sys.version.split()[0]} at " in out, out
