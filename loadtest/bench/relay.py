"""The relay benchmark: cachegate against SGLang's router in front of one synthetic streaming upstream.

    python -m loadtest.bench.relay [--streams 500,2000] [--interval 0.1] [--tokens 50] [--workers 1]
                                   [--redis-url URL] [--short-seconds 10] [--baseline /work/main]
                                   [--set overload.max_lag_ms=500] [--gateway-log FILE] [--pin] [--repeat N]
                                   [--floor]
    python -m loadtest.bench.relay --scaling --cpu-quota 0.4 [--rounds 2] [--short-seconds 8]

Starts the synthetic SGLang-like upstream (loadtest/bench/relay_upstream.py), the gateway (``--workers``
processes; with ``--redis-url`` they share state), sglang-router if it is installed (one router per
``--router-policy``: by default ``round_robin``, its cheapest, and ``cache_aware``, its default), and
optionally a second gateway run from another checkout (``--baseline DIR``: before and after in one run).
Then for each level of concurrent streams it runs the load generator (loadtest/bench/relay_load.py, its own
process) against each server in turn, and prints: streams completed, errors, CPU per relayed chunk (user+system of the
server's process tree, from /proc, over the whole level including connection set-up), peak RSS,
transit p50/p99 (upstream send → client receive, per chunk) and the ratio of CPU per chunk to each
router's. ``--short-seconds`` adds a short-request mode: keep-alive clients sending non-streamed
requests, CPU per 1,000, in ``--short-rounds`` rounds alternating the servers; ``--floor`` adds
the floor to it (loadtest/bench/floor_proxy.py: the same server and upstream client with no gateway
between them), so that the gateway's own share of a request is measured in the same run.
The Python servers run on this interpreter (printed at the start): run the benchmark from a venv of
the interpreter to measure (the image's is an optimized build; a venv's may not be).
``--pin`` keeps each server (gateway workers, baseline, router) on the last ``--workers`` CPUs and
the upstream and load generator on the others, so that on a small machine the harness does not
take the server's core (one worker is one core); ``--repeat N`` runs each level N times against
the same servers (the first run opens the upstream connections, the later ones find them pooled).

``--scaling`` runs only the workers mode instead (loadtest/bench/scale.py): closed-loop short requests
against 1 worker without Redis, 1 worker with Redis and 2 workers with Redis (a private
``redis-server`` unless ``--redis-url``), alternated ``--rounds`` times; ``--cpu-quota Q`` puts each
worker process in a cgroup of its own capped at Q CPUs, so that 1 worker gets Q and 2 workers 2Q
while the load generator, the upstream and Redis have the rest of the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from loadtest.bench.relay_stack import (
    FLOOR,
    HERE,
    ROUTER_POLICIES,
    Target,
    free_port,
    gateway_config,
    interpreter,
    measure,
    process,
    serve_command,
    start_floor,
    start_router,
    start_upstream,
)


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
        help="short mode: also the floor (loadtest/bench/floor_proxy.py: uvicorn and the upstream client, no gateway)",
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
            from loadtest.bench.scale import scaling

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
