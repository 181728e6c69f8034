"""The ``hol`` run: an oversized prompt retried in a loop while another team uses the same backend."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import orjson

from loadtest.chaos.load import Load, Tally, quantile
from loadtest.chaos.stack import TEAMS, Stack


async def run_hol(seconds: float = 30.0, out: Any = print) -> dict[str, Any]:
    """Head-of-line check: team ``a`` retries a prompt no backend can hold in a loop while team ``b``
    sends normal requests to the same (single) backend; b's latency against a run without a."""
    stack = Stack(twins=1, replicas=1, limit=8, redis=False)
    await stack.start()
    url = stack.urls[0]
    oversized = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "word " * 140_000}], "user": "a"}
    )  # encoded once: the client's own encoding is not the gateway's time
    refusals: list[float] = []
    codes: Counter[str] = Counter()
    stop = asyncio.Event()

    async def hammer() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                r = await client.post(
                    url + "/v1/chat/completions",
                    content=oversized,
                    headers={"authorization": f"Bearer {TEAMS['a']}", "content-type": "application/json"},
                )
                refusals.append(time.monotonic() - t0)
                codes[f"{r.status_code}:{r.json().get('error', {}).get('code')}"] += 1

    try:
        alone = await _team_b(stack, seconds)
        task = asyncio.create_task(hammer())
        await asyncio.sleep(1)
        with_hol = await _team_b(stack, seconds)
        stop.set()
        await task
    finally:
        await stack.close()
    res = {
        "refusal_p50": quantile(refusals, 0.5),
        "refusal_p99": quantile(refusals, 0.99),
        "refusal_max": max(refusals),
        "refused": dict(codes),
        "b_p99_alone": quantile(alone.latencies, 0.99),
        "b_p99_with": quantile(with_hol.latencies, 0.99),
        "b_max_alone": max(alone.latencies),
        "b_max_with": max(with_hol.latencies),
        "b_errors": dict(with_hol.errors),
    }
    out(
        f"oversized prompt: {len(refusals)} tries {dict(codes)}, refused in p50 {res['refusal_p50'] * 1e3:.1f} ms, "
        f"p99 {res['refusal_p99'] * 1e3:.1f} ms, max {res['refusal_max'] * 1e3:.1f} ms"
    )
    out(
        f"team b on the same backend: p99 {res['b_p99_alone']:.3f} s alone, {res['b_p99_with']:.3f} s meanwhile "
        f"(max {res['b_max_alone']:.3f} / {res['b_max_with']:.3f} s), errors {res['b_errors']}"
    )
    return res


async def _team_b(stack: Stack, seconds: float) -> Tally:
    load = Load(stack, workers=4, seed=3)
    load._tasks = [asyncio.create_task(load._worker("b")) for _ in range(4)]
    await asyncio.sleep(seconds)
    await load.stop()
    return load.tally
