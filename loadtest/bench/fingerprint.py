"""Measure the routing hot path: fingerprinting a 640 KB chat request (about 160k tokens), and one
``min-ttft`` / ``sglang-cache-aware`` decision over 64 cache slots with thousands of conversations
indexed; and the request path's bounds check on the same body (``gateway/surfaces/openai.py::check_shape``).
Prints p50 / p99 per step.

    .venv/bin/python -m loadtest.bench.fingerprint [--iterations 500]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gateway.surfaces.openai import check_shape
from policies.prefix import fingerprint, render, request_fingerprint
from policies.routers import MinTTFT, SglangCacheAware
from policies.types import BackendView, Fingerprint, Outcome, RequestFacts

TOKENS_PER_BYTE = 0.25


def chat_body(total_bytes: int, seed: int = 1) -> dict:
    """A coding-agent-like request: a system prompt, tools, then user / assistant / tool turns."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz      \n(){}[]=+-_.,:;"

    def text(n: int) -> str:
        return "".join(rng.choices(alphabet, k=n))

    messages: list[dict] = [{"role": "system", "content": text(40_000)}]
    size = 40_000
    i = 0
    while size < total_bytes:
        messages.append({"role": "user", "content": text(2_000)})
        messages.append(
            {
                "role": "assistant",
                "content": text(1_500),
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "x"}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": text(8_000)})
        size += 11_600
        i += 1
    tools = [
        {
            "type": "function",
            "function": {"name": f"tool{k}", "description": text(300), "parameters": {"type": "object"}},
        }
        for k in range(8)
    ]
    return {"model": "kimi-k2", "messages": messages, "tools": tools, "stream": True}


def timed(fn: Callable[[], object], iterations: int) -> list[float]:
    fn()  # warm caches
    samples = []
    for _ in range(iterations):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return samples


def row(name: str, samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100)
    return f"{name:<48} p50 {q[49] * 1e3:8.3f} ms   p99 {q[98] * 1e3:8.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--kib", type=int, default=640, help="request size in KiB")
    ap.add_argument("--conversations", type=int, default=2000)
    args = ap.parse_args()

    body = chat_body(args.kib * 1024)
    data = render(body)
    fp, nbytes = request_fingerprint(body, TOKENS_PER_BYTE)
    print(f"request: {nbytes:,} rendered bytes, {len(fp)} blocks, ~{sum(n for _, n in fp):,} tokens")
    print(row("render (canonical bytes)", timed(lambda: render(body), args.iterations)))
    print(row("fingerprint (chained block hashes)", timed(lambda: fingerprint(data, TOKENS_PER_BYTE), args.iterations)))
    print(
        row(
            "request_fingerprint (streamed render + hash)",
            timed(lambda: request_fingerprint(body, TOKENS_PER_BYTE), args.iterations),
        )
    )

    print(row("check_shape (depth, sizes, value count)", timed(lambda: check_shape(body), args.iterations)))

    # Routing over 8 backends x 8 DP ranks, with many conversations already indexed.
    backends = [BackendView(name=f"b{i}", kv_tokens=4_900_000, dp_size=8) for i in range(8)]
    system = fp[:40]
    rng = random.Random(2)
    for name, router in (("min-ttft", MinTTFT()), ("sglang-cache-aware", SglangCacheAware())):
        for c in range(args.conversations):
            conv: Fingerprint = system + tuple((rng.getrandbits(63), 256) for _ in range(rng.randint(80, 640)))
            r = RequestFacts(rid=f"c{c}", model="kimi-k2", prompt_tokens=0, fingerprint=conv)
            d = router.route(r, backends, float(c))
            assert d is not None
            router.dispatched(r, d, float(c))
            router.finished(r.rid, d.backend, Outcome(), float(c) + 0.5)
        probe = RequestFacts(rid="probe", model="kimi-k2", prompt_tokens=0, fingerprint=fp)
        print(
            row(
                f"{name}: route, 64 slots, {args.conversations} conversations",
                timed(lambda router=router, probe=probe: router.route(probe, backends, 1e6), args.iterations),
            )
        )


if __name__ == "__main__":
    main()
