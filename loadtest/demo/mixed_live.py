"""The mixed fleet live: an SGLang twin and a vLLM twin behind one gateway alias, against each twin
serving its share of the conversations alone, over real HTTP.

    python -m loadtest.demo.mixed_live --levels 8,16 --duration 60 --warmup 10

Three systems run side by side (same wall time, same machine load), each on its own twins
(``cachegate sim-backend --profile demo``, one with ``--engine vllm``), with the demo's workload
(``coding-agent`` at token scale 0.032, think scale 0.25, entered at a random turn):

- **mixed**: the gateway (``cachegate serve``, engines auto-detected) in front of both twins, ``N``
  conversations;
- **partition, SGLang first** / **partition, vLLM first**: no gateway; slots ``0 … N/2 − 1`` sent straight
  to one twin and ``N/2 … N − 1`` to the other (each engine alone with half the conversations), their
  tokens/min summed; the better of the two ways is the line the mixed fleet must meet.

Every level starts with fresh processes. Prints a Markdown table; every process started is stopped on
the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from loadtest.demo.run import MODEL, SCALE, THINK_SCALE, Processes, free_port, wait_ready
from loadtest.live.client import LiveConfig, run_level
from loadtest.results.tables import fmt_s, fmt_tpm


def _twin(procs: Processes, name: str, engine: str) -> tuple[str, Any]:
    port = free_port()
    args = ["sim-backend", "--profile", "demo", "--port", str(port), "--model", MODEL, "--engine", engine]
    return f"http://127.0.0.1:{port}", procs.start(name, args)


def _gateway(procs: Processes, name: str, twins: list[str]) -> tuple[str, Any]:
    port = free_port()
    args = ["serve", "--model", MODEL, "--port", str(port), "--host", "127.0.0.1", "--log-level", "warning"]
    for url in twins:
        args += ["--backend", url]
    return f"http://127.0.0.1:{port}", procs.start(name, args)


def _cfg(urls: list[str], n: int, first: int, args: argparse.Namespace, system: str) -> LiveConfig:
    return LiveConfig(
        base_urls=urls, model=MODEL, conversations=n, first_slot=first, duration_s=args.duration,
        warmup_s=args.warmup, seed=args.seed, scale=SCALE, think_scale=THINK_SCALE, warm_start=True, system=system,
    )  # fmt: skip


async def level(n: int, args: argparse.Namespace, procs: Processes) -> dict[str, dict[str, Any]]:
    """One level: the three systems at once, on fresh processes."""
    started = []
    twins: dict[str, str] = {}
    for system in ("mixed", "sv", "vs"):
        for engine in ("sglang", "vllm"):
            url, proc = _twin(procs, f"{system}-{engine}-{n}", engine)
            twins[f"{system}-{engine}"] = url
            started.append(proc)
    for (name, url), proc in zip(twins.items(), started, strict=True):
        wait_ready(procs, f"{name}-{n}", proc, f"{url}/health", 60)
    front, gw = _gateway(procs, f"gateway-{n}", [twins["mixed-sglang"], twins["mixed-vllm"]])
    wait_ready(procs, f"gateway-{n}", gw, f"{front}/readyz", 60)
    half = n // 2
    runs = {
        "mixed": run_level(_cfg([front], n, 0, args, "mixed")),
        "sv-first": run_level(_cfg([twins["sv-sglang"]], half, 0, args, "sv")),
        "sv-second": run_level(_cfg([twins["sv-vllm"]], half, half, args, "sv")),
        "vs-first": run_level(_cfg([twins["vs-vllm"]], half, 0, args, "vs")),
        "vs-second": run_level(_cfg([twins["vs-sglang"]], half, half, args, "vs")),
    }
    rows = dict(zip(runs, await asyncio.gather(*runs.values()), strict=True))
    Processes.stop([gw, *started])
    return rows


def table(results: dict[int, dict[str, dict[str, Any]]]) -> str:
    out = [
        "| conv. | system | tokens/min | × partition | TTFT p50 | TTFT p95 | longest wait | starved | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, rows in results.items():
        ways = {
            "partition, SGLang first": (rows["sv-first"], rows["sv-second"]),
            "partition, vLLM first": (rows["vs-first"], rows["vs-second"]),
        }
        best = max(a["total_tpm"] + b["total_tpm"] for a, b in ways.values())
        m = rows["mixed"]
        out.append(
            f"| {n} | mixed, gateway | {fmt_tpm(m['total_tpm'])} | {m['total_tpm'] / best:.2f} | "
            f"{fmt_s(m['ttft_p50_s'])} | {fmt_s(m['ttft_p95_s'])} | {fmt_s(m['max_wait_s'])} | {m['starved']} | "
            f"{m['errors']} |"
        )
        for name, (a, b) in ways.items():
            tpm = a["total_tpm"] + b["total_tpm"]
            out.append(
                f"| {n} | {name} | {fmt_tpm(tpm)} | {tpm / best:.2f} | – | – | "
                f"{fmt_s(max(a['max_wait_s'] or 0, b['max_wait_s'] or 0))} | {a['starved'] + b['starved']} | "
                f"{a['errors'] + b['errors']} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="8,16")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per level, warm-up included")
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    if any(n < 2 or n % 2 for n in levels):
        ap.error("--levels: even numbers of conversations (half on each engine)")
    logs = Path(tempfile.mkdtemp(prefix="cachegate-mixed-"))
    procs = Processes(logs)
    results: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        for n in levels:
            results[n] = asyncio.run(level(n, args, procs))
    except BaseException:
        print(f"the processes' logs are in {logs}", file=sys.stderr)
        raise
    finally:
        with contextlib.suppress(Exception):
            procs.stop_all()
    shutil.rmtree(logs, ignore_errors=True)
    print(table(results))


if __name__ == "__main__":
    main()
