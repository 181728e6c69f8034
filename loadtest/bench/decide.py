"""CPU of the decision core per request on the gateway's common path, without the gateway around it.

    .venv/bin/python -m loadtest.bench.decide [--requests 20000] [--repeats 5] [--inflight 32] [--case NAME] [--profile]

The core is built as ``cachegate serve`` builds it for the relay benchmark (``loadtest/bench/relay_stack.py``:
one team, one backend, policy ``gateway``), through ``loadtest/sim/live.py::build_core`` from that config.
Each request is arrive (dispatched at once) → first token → finish, with ``--inflight`` requests in
flight (the first token of the request ``inflight / 2`` back, the finish of the one ``inflight`` back),
in virtual time (one arrival every 0.5 ms) and a backend view refreshed every virtual second, as the
pool's load polls do. Bodies: ``short``, the benchmark's (one user message, ``max_tokens`` 16,
non-streamed: every request the same prompt, so one seat); ``conv100``, a 100-message conversation
(~30 KB), one of ``--inflight`` conversations in turn (a seat each). The facts carry the fingerprint
``gateway/request/lifecycle.py::_serve`` computes; that fingerprint's own cost is a separate figure.

Prints µs of process CPU per request (``time.process_time`` over all requests of a repeat; the median
of ``--repeats``). ``--profile`` prints a cProfile of one repeat of each instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

from loadtest.sim.live import build_core
from policies.prefix import request_fingerprint, total_tokens
from policies.tokens import TokenEstimator
from policies.types import BackendView, Outcome, RequestFacts

MODEL = "bench-model"
CONFIG: dict[str, Any] = {  # loadtest/bench/relay_stack.py::gateway_config
    "models": {MODEL: {"backends": [{"url": "http://127.0.0.1:1", "name": "up"}]}},
    "teams": {"default": {"max_concurrency": 100_000, "max_queue": 100_000, "queue_timeout_s": 300}},
}
SHORT = {
    "model": MODEL,
    "stream": False,
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "Write the next line of the program."}],
}
ARRIVAL_S = 0.0005
POLL_S = 1.0


def conversation(seed: int, messages: int = 100) -> dict[str, Any]:
    """A coding-agent-like body of ``messages`` messages (system prompt first), distinct per ``seed``."""
    line = "    result = compute(values[index], options) + offset  # keep the running total\n"
    body: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {seed}. " + line * 20}]
    for i in range(1, messages):
        role = "user" if i % 2 else "assistant"
        body.append({"role": role, "content": f"step {i}: " + line * (3 + i % 5)})
    return {"model": MODEL, "stream": False, "max_tokens": 16, "messages": body}


def facts_of(rid: str, body: dict[str, Any], ratio: float) -> RequestFacts:
    """``RequestFacts`` as ``gateway/request/lifecycle.py::_serve`` builds them (team ``default``)."""
    fp, _ = request_fingerprint(body, ratio)
    return RequestFacts(
        rid=rid,
        model=MODEL,
        team="default",
        stream=bool(body.get("stream")),
        prompt_tokens=total_tokens(fp),
        max_output_tokens=body.get("max_tokens") or 0,
        fingerprint=fp,
    )


def view(running: int) -> BackendView:
    """The relay benchmark's upstream as the pool reports it (``loadtest/bench/relay_upstream.py``)."""
    return BackendView("up", True, 1_000_000_000, 1, running, 0, 0.0)


def run_core(bodies: list[dict[str, Any]], requests: int, inflight: int) -> float:
    """µs of CPU per request for ``requests`` cycles on a fresh core (after one warm-up pass)."""
    ratio = TokenEstimator().ratio
    core = build_core("gateway", config=CONFIG)
    # Facts are built up front: the fingerprint is timed apart (``run_fingerprint``).
    protos = [facts_of("proto", b, ratio) for b in bodies]
    total = requests + inflight
    facts = [
        RequestFacts(
            rid=f"r{i}",
            model=p.model,
            team=p.team,
            stream=p.stream,
            prompt_tokens=p.prompt_tokens,
            max_output_tokens=p.max_output_tokens,
            fingerprint=p.fingerprint,
        )
        for i in range(total)
        for p in (protos[i % len(protos)],)
    ]
    outcome = Outcome(ok=True, prompt_tokens=protos[0].prompt_tokens, completion_tokens=16, cached_tokens=0)
    half = inflight // 2

    def cycle(start: int, stop: int) -> None:
        arrive, first_token, finish, set_backends = core.arrive, core.first_token, core.finish, core.set_backends
        polled = start * ARRIVAL_S
        for i in range(start, stop):
            now = i * ARRIVAL_S
            if now - polled >= POLL_S:
                set_backends(MODEL, [view(inflight)], now)
                polled = now
            decided = arrive(facts[i], now)
            assert decided and decided[0].rid == facts[i].rid, decided
            if i >= half:
                first_token(facts[i - half].rid, now)
            if i >= inflight:
                finish(facts[i - inflight].rid, outcome, now)

    core.set_backends(MODEL, [view(0)], 0.0)
    cycle(0, inflight)  # fill the pipeline
    t0 = time.process_time()
    cycle(inflight, total)
    return (time.process_time() - t0) / requests * 1e6


def run_fingerprint(body: dict[str, Any], requests: int) -> float:
    """µs of CPU per ``request_fingerprint`` call (as ``gateway/request/lifecycle.py::_serve`` makes it)."""
    ratio = TokenEstimator().ratio
    t0 = time.process_time()
    for _ in range(requests):
        request_fingerprint(body, ratio)
    return (time.process_time() - t0) / requests * 1e6


def median_of(repeats: int, fn: Callable[[], float]) -> tuple[float, list[float]]:
    runs = [fn() for _ in range(repeats)]
    return statistics.median(runs), runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--case", action="append", help="only these cases (e.g. 'core short'; repeatable)")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one repeat of each instead")
    args = parser.parse_args()
    n, k = args.requests, args.inflight
    short = [SHORT]
    conv = [conversation(c) for c in range(k)]
    cases: list[tuple[str, Callable[[], float]]] = [
        ("core short", lambda: run_core(short, n, k)),
        ("core conv100", lambda: run_core(conv, n, k)),
        ("fingerprint short", lambda: run_fingerprint(SHORT, n)),
        ("fingerprint conv100", lambda: run_fingerprint(conv[0], max(1, n // 10))),
    ]
    if args.case:
        cases = [c for c in cases if c[0] in args.case]
    if args.profile:
        for label, fn in cases:
            prof = cProfile.Profile()
            prof.runcall(fn)
            print(f"===== {label}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    size = len(str(conv[0]))
    print(f"{n} requests, {k} in flight, median of {args.repeats} (conv100 body ~{size // 1000} KB)")
    for label, fn in cases:
        med, runs = median_of(args.repeats, fn)
        print(f"{label:22s} {med:7.2f} µs/request   runs: {' '.join(f'{r:.2f}' for r in runs)}")


if __name__ == "__main__":
    main()
