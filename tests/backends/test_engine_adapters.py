"""The engine adapters read what each engine publishes, checked against the engines' own source:
vLLM 0.33.0's metric declarations, ``CacheConfig`` fields and DP-rank header (``backends/sim/vllm_ref.py``),
SGLang's ``/v1/loads`` as before; the config names the engine per backend."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from pydantic import ValidationError

from backends.engines import ENGINES, make
from backends.engines.sglang import SGLang, parse_loads
from backends.engines.vllm import RANK_HEADER, READ, VLLM, Scrape
from backends.sim import vllm_ref
from gateway.config.schema import Config


def test_the_pinned_vllm_is_installed() -> None:
    assert vllm_ref.installed_version() == vllm_ref.PINNED_VERSION


def test_every_series_the_adapter_reads_is_declared_by_vllm_with_its_kind() -> None:
    decls = vllm_ref.metric_declarations()
    expected = {
        "vllm:cache_config_info": "gauge",
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
    }
    assert set(READ) == set(expected)
    assert {name: decls[name].kind for name in READ} == expected
    for name in READ:
        if name != "vllm:cache_config_info":
            assert decls[name].labels == ("model_name", "engine"), name
    fields = vllm_ref.cache_config_fields()
    assert {"num_gpu_blocks", "block_size", "kv_cache_size_tokens"} <= fields


def _vllm_metrics(
    engines: int,
    blocks_summed: int,
    *,
    size_tokens: str = "None",
    running: tuple[int, ...] = (),
    usage: tuple[float, ...] = (),
    counts: tuple[float, float] = (0, 0),
) -> str:
    """A ``/metrics`` answer built with vLLM's own names, kinds and label names (the cache info's
    labels are every ``CacheConfig`` field, as ``CacheConfig.metrics_info`` makes them)."""
    decls = vllm_ref.metric_declarations()
    reg = CollectorRegistry()
    fields = sorted(vllm_ref.cache_config_fields())
    info = Gauge("vllm:cache_config_info", "CacheConfig", [*fields, "engine"], registry=reg)
    values = {f: "None" for f in fields} | {
        "num_gpu_blocks": str(blocks_summed),
        "block_size": "16",
        "kv_cache_size_tokens": size_tokens,
    }
    made = {}
    for name in READ[1:]:
        d = decls[name]
        cls = Gauge if d.kind == "gauge" else Counter
        made[name] = cls(name, "doc", list(d.labels or ()), registry=reg)
    for e in range(engines):
        info.labels(**values, engine=str(e)).set(1)
        lab = {"model_name": "kimi", "engine": str(e)}
        made["vllm:num_requests_running"].labels(**lab).set(running[e] if running else 0)
        made["vllm:num_requests_waiting"].labels(**lab).set(1)
        made["vllm:kv_cache_usage_perc"].labels(**lab).set(usage[e] if usage else 0.0)
        made["vllm:prefix_cache_queries"].labels(**lab).inc(counts[0] / engines)
        made["vllm:prefix_cache_hits"].labels(**lab).inc(counts[1] / engines)
    return generate_latest(reg).decode()


def test_vllm_capacity_per_rank_from_cache_config_info() -> None:
    # One engine: num_gpu_blocks × block_size.
    one = Scrape(_vllm_metrics(1, 10_000))
    assert (one.kv_tokens(), one.engines) == (160_000, 1)
    # Internal DP load balancing: the API server's num_gpu_blocks is the sum over its engines.
    four = Scrape(_vllm_metrics(4, 40_000))
    assert (four.kv_tokens(), four.engines) == (160_000, 4)
    # vLLM's own per-engine figure wins when it is published.
    assert Scrape(_vllm_metrics(4, 40_000, size_tokens="150000")).kv_tokens() == 150_000


def test_vllm_load_sums_ranks_takes_the_fullest_and_rates_hits_per_interval() -> None:
    adapter = VLLM()
    first = adapter.load_of(Scrape(_vllm_metrics(2, 20_000, running=(3, 5), usage=(0.25, 0.75), counts=(1000, 900))))
    assert (first.running, first.waiting, first.token_usage, first.ranks) == (8, 2, 0.75, 2)
    assert first.cache_hit_rate == pytest.approx(0.9)
    assert first.kv_tokens == 160_000
    # The next poll: 1,000 more tokens queried, 500 of them hits → 50 % over this interval.
    second = adapter.load_of(Scrape(_vllm_metrics(2, 20_000, counts=(2000, 1400))))
    assert second.cache_hit_rate == pytest.approx(0.5)


def test_vllm_pins_a_rank_by_the_header_vllm_reads_and_never_in_the_body() -> None:
    assert vllm_ref.rank_header().lower() == RANK_HEADER
    assert VLLM().pin(3) == (None, {RANK_HEADER: "3"})
    assert VLLM().pin(None) == (None, {})
    assert SGLang().pin(3) == (3, {})  # SGLang: routed_dp_rank in the body


def test_sglang_loads_as_before() -> None:
    loads = {
        "loads": [
            {"num_running_reqs": 2, "num_waiting_reqs": 1, "token_usage": 0.5, "cache_hit_rate": 0.8,
             "max_total_num_tokens": 1000},
            {"num_running_reqs": 3, "num_waiting_reqs": 0, "token_usage": 0.7, "cache_hit_rate": 0.6},
        ]
    }  # fmt: skip
    load = parse_loads(loads)
    assert load is not None
    assert (load.running, load.waiting, load.token_usage, load.kv_tokens) == (5, 1, 0.7, 1000)
    assert load.cache_hit_rate == pytest.approx(0.7)
    assert parse_loads({"loads": []}) is None


def test_vllm_info_without_a_cache_config_series_is_not_read() -> None:
    class Reply:
        status_code = 200
        content = b"# HELP x y\n# TYPE x gauge\nx 1\n"

        def json(self) -> object:
            raise ValueError

    async def get(path: str) -> Reply:
        return Reply()

    info, error = asyncio.run(VLLM().read_info(get))
    assert error is not None and "cache_config_info" in error
    assert info.kv_tokens == 0


def _backend(**fields: object) -> dict[str, object]:
    return {"models": {"kimi": {"backends": [{"url": "http://h:1", **fields}]}}}


def test_engine_per_backend_in_the_config() -> None:
    assert Config.model_validate(_backend()).models["kimi"].backends[0].engine == "auto"
    for name in ENGINES:
        assert Config.model_validate(_backend(engine=name)).models["kimi"].backends[0].engine == name
        assert make(name).name == name
    with pytest.raises(ValidationError, match="sglang"):
        Config.model_validate(_backend(engine="tgi"))
    with pytest.raises(ValidationError, match="no DP ranks"):
        Config.model_validate(_backend(engine="openai", dp_size=2))
    assert Config.model_validate(_backend(kv_tokens=500_000)).models["kimi"].backends[0].kv_tokens == 500_000
