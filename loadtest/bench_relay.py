"""The relay benchmark: cachegate against SGLang's router in front of one synthetic streaming upstream.

    python -m loadtest.bench_relay [--streams 500,2000] [--interval 0.1] [--tokens 50] [--workers 1]
                                   [--redis-url URL] [--short-seconds 10] [--baseline /work/main]
                                   [--set overload.max_lag_ms=500] [--gateway-log FILE] [--pin] [--repeat N]
                                   [--floor]
    python -m loadtest.bench_relay --scaling --cpu-quota 0.4 [--rounds 2] [--short-seconds 8]

Starts the synthetic SGLang-like upstream (loadtest/relay_upstream.py), the gateway (``--workers``
processes; with ``--redis-url`` they share state), sglang-router if it is installed (one router per
``--router-policy``: by default ``round_robin``, its cheapest, and ``cache_aware``, its default), and
optionally a second gateway run from another checkout (``--baseline DIR``: before and after in one run).
Then for each level of concurrent streams it runs the load generator (loadtest/relay_load.py, its own
process) against each server in turn, and prints: streams completed, errors, CPU per relayed chunk (user+system of the
server's process tree, from /proc, over the whole level including connection set-up), peak RSS,
transit p50/p99 (upstream send → client receive, per chunk) and the ratio of CPU per chunk to each
router's. ``--short-seconds`` adds a short-request mode: keep-alive clients sending non-streamed
requests, CPU per 1,000, in ``--short-rounds`` rounds alternating the servers; ``--floor`` adds
the floor to it (loadtest/floor_proxy.py: the same server and upstream client with no gateway
between them), so that the gateway's own share of a request is measured in the same run.
The Python servers run on this interpreter (printed at the start): run the benchmark from a venv of
the interpreter to measure (the image's is an optimized build; a venv's may not be).
``--pin`` keeps each server (gateway workers, baseline, router) on the last ``--workers`` CPUs and
the upstream and load generator on the others, so that on a small machine the harness does not
take the server's core (one worker is one core); ``--repeat N`` runs each level N times against
the same servers (the first run opens the upstream connections, the later ones find them pooled).

``--scaling`` runs only the workers mode instead (loadtest/bench_scale.py): closed-loop short requests
against 1 worker without Redis, 1 worker with Redis and 2 workers with Redis (a private
``redis-server`` unless ``--redis-url``), alternated ``--rounds`` times; ``--cpu-quota Q`` puts each
worker process in a cgroup of its own capped at Q CPUs, so that 1 worker gets Q and 2 workers 2Q
while the load generator, the upstream and Redis have the rest of the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

MODEL = "bench-model"
HERE = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(url)


@contextlib.contextmanager
def process(
    args: list[str], ready: str | None, cwd: Path = HERE, log: Path | None = None, cpus: set[int] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``args`` as a child process (on ``cpus`` only, if given; its children inherit them), stopped at exit."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115  # closed below
    proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=out, preexec_fn=_on(cpus))
    try:
        if ready:
            _wait(ready, proc)
        else:
            time.sleep(0.5)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if log:
            out.close()  # type: ignore[union-attr]


def _on(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that keeps the child on ``cpus`` (``--pin``)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return out


def cpu_seconds(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


@dataclass
class Target:
    name: str
    port: int
    pid: int


def measure(target: Target, load_args: list[str], cpus: set[int] | None = None) -> dict[str, Any]:
    """Run the load generator once against ``target``; the server's CPU and peak RSS over the run."""
    peak = [rss_mb(target.pid)]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            peak[0] = max(peak[0], rss_mb(target.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    cpu0 = cpu_seconds(target.pid)
    sampler.start()
    out = subprocess.run(
        [sys.executable, "-m", "loadtest.relay_load", *load_args, "--port", str(target.port)],
        cwd=HERE,
        capture_output=True,
        check=True,
        preexec_fn=_on(cpus),
    ).stdout
    stop.set()
    sampler.join()
    result: dict[str, Any] = orjson.loads(out)
    result["cpu_s"] = cpu_seconds(target.pid) - cpu0
    result["rss_mb"] = peak[0]
    return result


def gateway_config(path: Path, upstream: str, overrides: list[str] = ()) -> Path:  # type: ignore[assignment]
    """The benchmark's gateway config; ``overrides`` are ``dotted.key=YAML`` (e.g. ``overload.max_lag_ms=500``)."""
    cfg: dict[str, Any] = {
        "models": {MODEL: {"backends": [{"url": upstream, "name": "up"}]}},
        "teams": {"default": {"max_concurrency": 100_000, "max_queue": 100_000, "queue_timeout_s": 300}},
    }
    for item in overrides:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_upstream(stack: contextlib.ExitStack, interval: float, cpus: set[int] | None = None) -> str:
    """The synthetic upstream (one chunk per ``interval`` a stream) until ``stack`` closes: its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "loadtest.relay_upstream", "--port", str(port), "--interval", str(interval)]
    stack.enter_context(process(cmd, url + "/health", cpus=cpus))
    return url


def serve_command(cfg: Path, port: int, policy: str = "gateway", workers: int = 1) -> list[str]:
    """``cachegate serve`` as the benchmarks run it."""
    return [
        *(sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)),
        *("--log-level", "warning", "--policy", policy, "--workers", str(workers)),
    ]


def start_router(
    stack: contextlib.ExitStack, upstream: str, cpus: set[int] | None = None, policy: str = "round_robin"
) -> Target | None:
    """sglang-router (``policy``) in front of ``upstream`` until ``stack`` closes; None if not installed."""
    if importlib.util.find_spec("sglang_router") is None:
        return None
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", upstream, "--policy", policy]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
    cmd += ["--prometheus-port", str(free_port())]  # not its default 29000: another router may hold it
    proc = stack.enter_context(process(cmd, f"http://127.0.0.1:{port}/health", cpus=cpus))
    return Target(f"sglang-router {policy}", port, proc.pid)


ROUTER_POLICIES = ("round_robin", "cache_aware")
FLOOR = "floor"
"""The short mode's floor (``--floor``, loadtest/floor_proxy.py): the server and the upstream client alone."""


def start_floor(stack: contextlib.ExitStack, upstream: str, cpus: set[int] | None = None) -> Target:
    """loadtest/floor_proxy.py in front of ``upstream`` until ``stack`` closes."""
    port = free_port()
    cmd = [sys.executable, "-m", "loadtest.floor_proxy", "--upstream", upstream, "--port", str(port)]
    proc = stack.enter_context(process(cmd, f"http://127.0.0.1:{port}/", cpus=cpus))
    return Target(FLOOR, port, proc.pid)


def interpreter() -> str:
    """The Python the gateway, baseline and floor run on (this one: ``sys.executable``). Its build
    moves their CPU: docs/benchmarks.md, "The short request, sixth pass: the interpreter"."""
    with open("/proc/self/maps") as maps:
        shared = next((line.split()[-1] for line in maps if "/libpython" in line), None)
    build = f"libpython shared ({shared})" if shared else "libpython linked in"
    return f"Python {sys.version.split()[0]} at {os.path.realpath(sys.executable)}, {build}"


def _ratio_heads(names: list[str], note: str = "") -> str:
    """The ``× router`` column heads of a table: one per router, named by its policy."""
    return "".join(f" × {n.removeprefix('sglang-router ')}{note} |" for n in names) or " × router |"


def _ratios(per: float, refs: list[float]) -> str:
    """The ``× router`` cells of a row: ``per`` over each router's figure."""
    return "".join(f" {per / ref:.2f} |" if ref else " - |" for ref in refs) or " - |"


def short_mode(targets: list[Target], names: list[str], args: argparse.Namespace, harness: set[int] | None) -> None:
    """Keep-alive clients sending non-streamed requests against each server, in ``--short-rounds``
    rounds (each server ``--short-seconds`` / rounds a round, the order rotated), so that a drift of
    the machine's state during the run falls on every server alike. CPU per 1,000 over all rounds;
    the ratio to each router is of those totals, with the per-round ratios' range beside it."""
    rounds = max(1, args.short_rounds)
    seconds = args.short_seconds / rounds
    pace = f"{args.short_rate:.0f} requests/s in all" if args.short_rate else "closed loop"
    print(
        f"\nshort requests: {args.short_connections} keep-alive connections, {pace}, {args.short_seconds:g} s "
        f"against each server in {rounds} round(s), the order rotated\n"
    )
    load = ["short", "--connections", str(args.short_connections), "--seconds", f"{seconds:g}"]
    load += ["--rate", str(args.short_rate)]
    per_round: list[dict[str, dict[str, Any]]] = []
    for k in range(rounds):
        order = targets[k % len(targets) :] + targets[: k % len(targets)]
        per_round.append({t.name: measure(t, load, harness) for t in order})

    def per_1000(rows: list[dict[str, Any]]) -> float:
        return sum(r["cpu_s"] for r in rows) / max(1, sum(r["completed"] for r in rows)) * 1000

    refs = names + ([FLOOR] if any(t.name == FLOOR for t in targets) else [])
    print(f"| server | requests | errors | req/s | CPU s | CPU s per 1,000 |{_ratio_heads(refs, ' (rounds)')}")
    print("|---|---|---|---|---|---|" + "---|" * max(1, len(refs)))
    for t in targets:
        rows = [rnd[t.name] for rnd in per_round]
        errors: dict[str, int] = {}
        for r in rows:
            for kind, n in r["errors"].items():
                errors[kind] = errors.get(kind, 0) + n
        mine = per_1000(rows)
        cells = ""
        for n in refs:
            ref = per_1000([rnd[n] for rnd in per_round])
            # a round whose router CPU read 0 (the clock's 10 ms tick, on a tiny run) gives no ratio
            each = [per_1000([rnd[t.name]]) / b for rnd in per_round if (b := per_1000([rnd[n]])) > 0]
            spread = f" ({min(each):.2f}-{max(each):.2f})" if each else ""
            cells += f" {mine / ref:.2f}{spread} |" if ref else " - |"
        completed = sum(r["completed"] for r in rows)
        print(
            f"| {t.name} | {completed} | {_fmt_errors(errors)} | {completed / sum(r['wall_s'] for r in rows):.0f} | "
            f"{sum(r['cpu_s'] for r in rows):.1f} | {mine:.2f} |{cells or ' - |'}",
            flush=True,
        )


def _fmt_errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "0"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="cachegate bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--streams",
        default="500,2000",
        help="levels of concurrent streams, comma-separated (0: none, the short mode alone)",
    )
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between chunks of a stream")
    parser.add_argument("--tokens", type=int, default=50, help="content chunks per stream")
    parser.add_argument("--ramp", type=float, default=0.0, help="seconds to open the streams (default: N/1000)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--redis-url", default=None, help="shared state for --workers > 1")
    parser.add_argument("--policy", default="gateway")
    parser.add_argument("--short-seconds", type=float, default=0.0, help="also run the short-request mode")
    parser.add_argument("--short-connections", type=int, default=32)
    parser.add_argument("--short-rate", type=float, default=400.0, help="requests/s in all (0: closed loop)")
    parser.add_argument("--baseline", type=Path, default=None, help="also run the gateway from this checkout")
    parser.add_argument("--no-router", action="store_true")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="short mode: also the floor (loadtest/floor_proxy.py: uvicorn and the upstream client, no gateway)",
    )
    parser.add_argument("--gateway-log", type=Path, default=None, help="append the gateway's output to this file")
    parser.add_argument("--scaling", action="store_true", help="run the workers mode only (see above)")
    parser.add_argument("--cpu-quota", type=float, default=None, help="--scaling: CPUs per worker (cgroup v1)")
    parser.add_argument("--rounds", type=int, default=2, help="--scaling: rounds, alternated")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="servers on the last --workers CPUs, the upstream and the load generator on the others",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per level against the same servers")
    parser.add_argument(
        "--router-policy",
        default="round_robin,cache_aware",
        help="sglang-router's policies, one router each, comma-separated: round_robin (its cheapest) and "
        "cache_aware (its default, a prefix tree per request like cachegate's routing)",
    )
    parser.add_argument(
        "--short-rounds",
        type=int,
        default=3,
        help="short mode: rounds of --short-seconds / rounds against each server, the order rotated each round",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override the (branch) gateway's config, e.g. overload.max_lag_ms=500 (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.floor and not args.short_seconds:
        parser.error("--floor runs in the short mode: give --short-seconds too")
    policies = [p for p in args.router_policy.split(",") if p]
    if any(p not in ROUTER_POLICIES for p in policies):
        parser.error(f"--router-policy: each of {', '.join(ROUTER_POLICIES)}")
    servers = harness = None
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) <= args.workers:
            parser.error(f"--pin needs more than --workers CPUs; this process has {len(cpus)}")
        servers, harness = set(cpus[-args.workers :]), set(cpus[: -args.workers])
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-relay-")))
        upstream = start_upstream(stack, args.interval, harness)
        cfg = gateway_config(tmp / "gateway.yaml", upstream, args.set)
        if args.scaling:
            from loadtest.bench_scale import scaling

            conns, seconds = args.short_connections, args.short_seconds or 8.0
            scaling(cfg, args.redis_url, args.cpu_quota, args.rounds, conns, seconds, HERE)
            return
        base_cfg = gateway_config(tmp / "baseline.yaml", upstream)
        targets: list[Target] = []
        sources = [("cachegate", HERE)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        for name, src in sources:
            conf = cfg if name == "cachegate" else base_cfg
            port = free_port()
            cmd = serve_command(conf, port, args.policy, args.workers)
            if args.redis_url:
                cmd += ["--redis-url", args.redis_url]
            log = args.gateway_log if name == "cachegate" else None
            ready = f"http://127.0.0.1:{port}/readyz"
            proc = stack.enter_context(process(cmd, ready, cwd=src, log=log, cpus=servers))
            targets.append(Target(name, port, proc.pid))
        routers = [] if args.no_router else [start_router(stack, upstream, servers, p) for p in policies]
        targets += [r for r in routers if r is not None]
        names = [t.name for t in targets if t.name.startswith("sglang-router")]
        print(
            f"upstream: one chunk every {args.interval * 1000:.0f} ms, {args.tokens} chunks per stream; "
            f"gateway: {args.workers} worker(s), policy {args.policy}"
            f"{'' if not names else '; ' + ', '.join(names)}"
            f"{', Redis ' + args.redis_url if args.redis_url else ', no Redis'}; load generator: its own process"
            + (f"; servers on CPU {sorted(servers)}, harness on {sorted(harness or ())}" if servers else "")
            + f"\ngateway, baseline and floor on {interpreter()}\n"
        )
        print(
            f"| streams | server | completed | errors | CPU s | CPU/chunk µs |{_ratio_heads(names)} RSS MB | "
            "transit p50 ms | transit p99 ms |"
        )
        print(f"|---|---|---|---|---|---|{'---|' * max(1, len(names))}---|---|---|")
        levels = [int(s) for s in args.streams.split(",")]
        for level in (n for n in levels for _ in range(args.repeat) if n > 0):
            ramp = args.ramp or max(0.5, level / 1000)
            timeout = ramp + args.tokens * args.interval * 3 + 30
            rows = [
                (
                    t,
                    measure(
                        t,
                        [
                            "streams",
                            "--streams",
                            str(level),
                            "--tokens",
                            str(args.tokens),
                            "--ramp",
                            str(ramp),
                            "--timeout",
                            str(timeout),
                        ],
                        harness,
                    ),
                )
                for t in targets
            ]
            refs = [r["cpu_s"] / max(1, r["chunks"]) for t, r in rows if t.name in names]
            for t, r in rows:
                per = r["cpu_s"] / max(1, r["chunks"])
                print(
                    f"| {level} | {t.name} | {r['completed']} | {_fmt_errors(r['errors'])} | {r['cpu_s']:.1f} | "
                    f"{per * 1e6:.1f} |{_ratios(per, refs)} {r['rss_mb']:.0f} | {r['transit_p50_ms']} | "
                    f"{r['transit_p99_ms']} |",
                    flush=True,
                )
        if args.short_seconds:
            floor = [start_floor(stack, upstream, servers)] if args.floor else []
            short_mode(targets + floor, names, args, harness)


if __name__ == "__main__":
    main()
