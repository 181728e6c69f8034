"""The twin serves the profiles and reports SGLang's DP settings; the pool reads the running cap."""

from __future__ import annotations

import asyncio

import httpx

from backends.pool import BackendPool
from backends.sim.testing import run_twin, spawn_twin
from gateway.config import load_config


def test_sim_backend_serves_the_fitted_profile_with_sglang_dp_settings() -> None:
    with spawn_twin("b300-dp8-fp8-cp", time_scale=0.05) as url:
        info = httpx.get(f"{url}/get_server_info", timeout=10).json()
    assert info["dp_size"] == 8 and info["enable_dp_attention"] is True
    assert info["chunked_prefill_size"] == 16384 // 8  # SGLang divides the chunk by dp_size
    assert info["max_running_requests"] == 40 // 8  # the deployment's 40, per rank
    assert abs(info["schedule_conservativeness"] - 0.3) < 1e-9
    assert info["twin"]["profile"] == "b300-dp8-fp8-cp"


def test_pool_reads_max_running_requests_into_the_backend_view() -> None:
    async def fetch(url: str) -> tuple[int, int]:
        config = load_config(backends=[url], model="kimi")
        pool = BackendPool(config)
        await pool.start()
        try:
            view = pool.views("kimi")[0]
            return view.max_running_requests, view.kv_tokens
        finally:
            await pool.stop()

    with run_twin("b300-dp8-fp8-cp", time_scale=0.05) as url:
        running, kv = asyncio.run(fetch(url))
    assert running == 5 and kv == 4_953_920
