"""A request that can never run is refused at once, in the surface's own envelope, and reaches no
backend: past the context window (prompt + max_tokens) on each surface, and a prompt larger than
the backend's KV cache. A twin in process, the gateway's ASGI app in process."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from backends.sim.testing import run_twin
from tests.fake_upstream import SERVED
from tests.gateway.asgi import config, running

HUGE = 10_000_000  # max_tokens past any context window
HEADERS = {"anthropic-version": "2023-06-01"}
USER = [{"role": "user", "content": "hi"}]


async def _ready(app: Any) -> tuple[int, int]:
    """Wait for the pool to learn the backend's context window and KV pool (``/get_server_info``)."""
    pool = app.state.gateway.pool
    for _ in range(200):
        b = pool.all()[0]
        if b.max_model_len and b.max_total_num_tokens and b.healthy:
            return b.max_model_len, b.max_total_num_tokens
        await asyncio.sleep(0.05)
    raise AssertionError("the pool never read the twin's figures")


@pytest.mark.parametrize("policy", ["gateway", "direct"])  # admission, and none (PassThroughCore)
def test_never_runs_in_each_surface_envelope(policy: str) -> None:
    with run_twin("tiny", time_scale=0.01, model=SERVED, kv_tokens=20_000) as twin:

        async def main() -> None:
            async with running(config(twin, policy=policy)) as (app, client):
                window, kv = await _ready(app)
                assert kv == 20_000 and window > kv
                twin_state = app.state.gateway.pool.all()[0]
                before = twin_state.running + twin_state.waiting
                cases = [
                    ("/v1/chat/completions", {"model": "kimi", "messages": USER, "max_tokens": HUGE}),
                    ("/v1/completions", {"model": "kimi", "prompt": "hi", "max_tokens": HUGE}),
                    ("/v1/responses", {"model": "kimi", "input": "hi", "max_output_tokens": HUGE}),
                    ("/v1/messages", {"model": "kimi", "messages": USER, "max_tokens": HUGE}),
                    # a prompt past the whole KV cache (20k tokens), with a small max_tokens
                    (
                        "/v1/chat/completions",
                        {"model": "kimi", "max_tokens": 8, "messages": [{"role": "user", "content": "word " * kv}]},
                    ),
                ]
                for path, body in cases:
                    started = time.perf_counter()
                    r = await client.post(path, json=body, headers=HEADERS)
                    took = time.perf_counter() - started
                    assert r.status_code == 400, (path, r.status_code, r.text[:300])
                    assert "retry-after" not in r.headers  # not to be retried as it is
                    assert took < 1.0, (path, took)  # at once, not after a queue timeout
                    out = r.json()
                    if path == "/v1/messages":
                        assert out["type"] == "error" and out["error"]["type"] == "invalid_request_error"
                        assert r.headers["x-cachegate-code"] == "context_length_exceeded"
                        assert "never run" in out["error"]["message"]
                    else:
                        assert set(out) == {"error"}, out
                        assert out["error"]["code"] == "context_length_exceeded", out
                        assert out["error"]["type"] == "invalid_request_error"
                # nothing was queued or seated: a normal request goes through at once
                core = app.state.gateway.core
                if policy == "direct":
                    assert core.inflight() == {} and before == 0
                else:
                    snap = core.snapshot()
                    assert snap["waiting"] == 0 and snap["running"] == 0 and before == 0
                r = await client.post("/v1/chat/completions", json={"model": "kimi", "messages": USER, "max_tokens": 4})
                assert r.status_code == 200, r.text[:300]

        asyncio.run(main())
