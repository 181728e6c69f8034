"""The twin serves the profiles and reports SGLang's DP settings; the pool reads the running cap."""

from __future__ import annotations

import asyncio

import httpx

from backends.pool import BackendPool
from backends.sim.testing import run_twin, spawn_twin
from gateway.config.schema import load_config


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


def test_twin_reports_decode_context_parallelism_kv_dtype_and_the_host_tier() -> None:
    infos = {}
    for name in ("b300-tp8-fp8-dcp8", "b300-tp8-fp8-hicache", "b300-tp8-bf16"):
        with run_twin(name, time_scale=0.05) as url:
            infos[name] = httpx.get(f"{url}/get_server_info", timeout=10).json()
    dcp, hi, bf16 = infos["b300-tp8-fp8-dcp8"], infos["b300-tp8-fp8-hicache"], infos["b300-tp8-bf16"]
    # --dcp-size 8: the pool's logical capacity is 8 × one GPU's rows (SGLang's logical_token_capacity)
    assert (dcp["tp_size"], dcp["dcp_size"], dcp["dp_size"]) == (8, 8, 1)
    assert dcp["max_total_num_tokens"] == 8 * hi["max_total_num_tokens"]
    memory = dcp["internal_states"][0]["memory_usage"]
    assert abs(memory["kvcache"] - hi["internal_states"][0]["memory_usage"]["kvcache"]) < 1e-6  # same bytes per GPU
    assert 180 < memory["kvcache"] < 190 and 70 < memory["weight"] < 80  # 0.9 × 288 GB − 74.4 GB of weights
    assert (dcp["kv_cache_dtype"], hi["kv_cache_dtype"], bf16["kv_cache_dtype"]) == ("fp8_e4m3", "fp8_e4m3", "auto")
    assert (hi["enable_hierarchical_cache"], dcp["enable_hierarchical_cache"]) == (True, False)
    assert (hi["dcp_size"], bf16["dcp_size"]) == (1, 1)
