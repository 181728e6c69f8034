"""The twin speaking vLLM (``sim-backend --engine vllm``) against vLLM 0.33.0's own source: its routes,
the ``vllm:`` series (names, kinds, label names), the error envelope and model list (vLLM's pydantic
models), the DP-rank header; and the pool reading it over real HTTP, configured or detected."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.pool import BackendPool
from backends.sim import vllm_ref
from backends.sim.testing import run_twin, twin_of
from gateway.config.schema import Config

P = vllm_ref.load_protocol()
MODEL = "moonshotai/Kimi-K2-Instruct"


def test_the_vllm_twin_serves_vllms_routes_and_none_of_sglangs() -> None:
    with run_twin("tiny", time_scale=0.05, engine="vllm") as url:
        served = {
            (m, p.replace("{model:path}", "{model}"))
            for p, ops in httpx.get(url + "/openapi.json").json()["paths"].items()
            for m in (o.upper() for o in ops)
        }
        for path in ("/get_server_info", "/v1/loads", "/get_model_info", "/generate"):
            assert httpx.get(url + path).status_code == 404, path
    # /metrics is a Mount in vLLM (instrumentator/metrics.py), not a router route.
    assert served - vllm_ref.routes() == {("GET", "/metrics")}
    mounted = (vllm_ref.vllm_root() / "entrypoints/serve/instrumentator/metrics.py").read_text()
    assert 'Mount("/metrics"' in mounted


def test_every_vllm_series_of_the_twin_is_declared_by_vllm_with_its_kind_and_labels() -> None:
    decls = vllm_ref.metric_declarations()
    with run_twin("b300-dp2-bf16", time_scale=0.05, engine="vllm") as url:
        text = httpx.get(url + "/metrics").text
    # prometheus-client's own *_created companions (vLLM's default single-process registry has them too).
    families = {
        f.name: f
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:") and not f.name.endswith("_created")
    }
    assert len(families) >= 9
    for name, fam in families.items():
        decl = decls.get(name)
        assert decl is not None, f"{name} is not a vLLM 0.33.0 metric"
        assert fam.type == decl.kind, name
        for sample in fam.samples:
            labels = set(sample.labels) - {"le"}
            if decl.labels is None:  # the info gauge: CacheConfig's fields plus engine
                assert labels - {"engine"} <= vllm_ref.cache_config_fields(), labels - vllm_ref.cache_config_fields()
            else:
                assert labels == set(decl.labels), (name, labels)
    # Two DP engines: one series per engine; num_gpu_blocks is the API server's sum over engines.
    info = [s.labels for s in families["vllm:cache_config_info"].samples]
    assert sorted(i["engine"] for i in info) == ["0", "1"]
    per_engine = int(info[0]["kv_cache_size_tokens"])
    assert int(info[0]["num_gpu_blocks"]) * int(info[0]["block_size"]) == 2 * per_engine


def test_errors_and_the_model_list_are_vllms_own_models() -> None:
    with run_twin("tiny", time_scale=0.05, engine="vllm") as url:
        bad = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": [], "max_tokens": -1})
        models = httpx.get(url + "/v1/models").json()
    assert bad.status_code == 400
    err = P.ErrorResponse.model_validate(bad.json())
    assert err.error.code == 400 and err.error.message
    assert set(bad.json()) == {"error"}  # nested, not SGLang's flat {"object": "error", ...}
    listed = P.ModelList.model_validate(models)
    assert [(c.id, c.max_model_len, c.owned_by) for c in listed.data] == [(MODEL, 262_144, "vllm")]


def test_a_request_lands_on_the_rank_its_header_names_and_a_body_field_is_ignored() -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
        "routed_dp_rank": 0,  # an unknown extra field to vLLM
    }
    with run_twin("b300-dp2-bf16", time_scale=0.2, engine="vllm") as url:
        engine = twin_of(url).engine
        headers = {vllm_ref.rank_header(): "1"}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
            assert r.status_code == 200
            next(r.iter_lines())
            running = [ld.num_running_reqs + ld.num_waiting_reqs for ld in engine.loads()]
    assert running == [0, 1]


def _pool(url: str, engine: str) -> BackendPool:
    config = Config.model_validate(
        {"models": {"kimi": {"upstream_model": MODEL, "backends": [{"url": url, "engine": engine}]}}}
    )
    return BackendPool(config)


@pytest.mark.parametrize("engine", ["vllm", "auto"])
def test_the_pool_reads_capacity_ranks_and_window_from_a_vllm_server(
    engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def run(url: str) -> tuple[str, int, int | None, int, str, int]:
        pool = _pool(url, engine)
        await pool.start()
        try:
            b = pool.all()[0]
            for _ in range(3):
                await pool._check(b)
            await pool._poll_load(b)
            return b.engine, b.max_total_num_tokens, b.reported_dp_size, b.max_model_len, b.capacity_source, b.running
        finally:
            await pool.stop()

    twin = run_twin("b300-dp2-bf16", time_scale=0.05, engine="vllm")
    with caplog.at_level(logging.INFO, "cachegate.pool"), twin as url:
        per_rank = twin_of(url).engine.loads()[0].max_total_num_tokens
        got = asyncio.run(run(url))
    assert got == ("vllm", per_rank // 16 * 16, 2, 262_144, "reported", 0)
    detected = [r for r in caplog.records if "engine detected" in r.getMessage()]
    assert len(detected) == (1 if engine == "auto" else 0)


def test_auto_still_detects_sglang_and_reads_it_as_before() -> None:
    async def run(url: str) -> tuple[str, int, int]:
        pool = _pool(url, "auto")
        await pool.start()
        try:
            b = pool.all()[0]
            return b.engine, b.max_total_num_tokens, b.max_running_requests
        finally:
            await pool.stop()

    with run_twin("tiny", time_scale=0.05) as url:
        engine = twin_of(url).engine
        got = asyncio.run(run(url))
        assert got == ("sglang", engine.max_total_num_tokens, twin_of(url).profile.max_running_requests)
