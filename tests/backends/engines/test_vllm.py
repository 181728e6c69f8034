"""``backends/engines/vllm.py``: what the adapter reads from vLLM 0.33.0's ``/metrics``, checked against
vLLM's own metric declarations, ``CacheConfig`` fields and DP-rank header (``backends/sim/vllm_ref.py``),
and read over HTTP from the twin speaking vLLM (``engine="vllm"``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from backends.engines.base import Fetch
from backends.engines.sglang import SGLang
from backends.engines.vllm import RANK_HEADER, READ, VLLM, Scrape, parse_info
from backends.sim import vllm_ref
from backends.sim.profiles import get_profile
from backends.sim.server import create_app


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
    assert VLLM().pin(0) == (None, {RANK_HEADER: "0"})  # rank 0 is a rank, not "unset"
    assert VLLM().pin(None) == (None, {})
    assert SGLang().pin(3) == (3, {})  # SGLang: routed_dp_rank in the body


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


def test_a_counter_that_went_down_restarts_the_interval_and_nothing_queried_keeps_the_totals_ratio() -> None:
    adapter = VLLM()
    adapter.load_of(Scrape(_vllm_metrics(1, 1000, counts=(1000, 100))))
    # vLLM restarted: the counters start again below the last reading; rate from the new totals.
    restarted = adapter.load_of(Scrape(_vllm_metrics(1, 1000, counts=(200, 150))))
    assert restarted.cache_hit_rate == pytest.approx(0.75)
    # Nothing queried since: the totals' ratio, not a division by zero.
    idle = adapter.load_of(Scrape(_vllm_metrics(1, 1000, counts=(200, 150))))
    assert idle.cache_hit_rate == pytest.approx(0.75)
    assert VLLM().load_of(Scrape(_vllm_metrics(1, 1000))).cache_hit_rate == 0.0


def test_a_size_not_yet_profiled_falls_back_to_the_blocks_and_no_series_means_no_engine() -> None:
    # "None" before vLLM has profiled its memory (kv_cache_size_tokens), then blocks × size.
    assert Scrape(_vllm_metrics(2, 2_000, size_tokens="None")).kv_tokens() == 16_000
    assert Scrape(_vllm_metrics(1, 0)).kv_tokens() == 0  # num_gpu_blocks 0: not published
    empty = Scrape("")
    assert (empty.engines, empty.kv_tokens(), empty.total("vllm:num_requests_running")) == (0, 0, 0)
    assert parse_info(empty).dp_ranks is None  # no engine listed: DP size unknown, not 0


def test_only_the_families_read_are_parsed() -> None:
    text = _vllm_metrics(1, 100) + (
        "# HELP vllm:e2e_request_latency_seconds x\n# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="1.0",engine="0"} 3\n'
    )
    scrape = Scrape(text)
    assert set(scrape.values) <= set(READ)
    assert "vllm:e2e_request_latency_seconds" not in scrape.values


@pytest.fixture()
async def vllm_twin() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app("b300-dp2-bf16", engine="vllm", time_scale=0.02, stream_interval_s=0.0)
    async with (
        LifespanManager(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://twin") as client,
    ):
        yield client


def _fetch(client: httpx.AsyncClient) -> Fetch:
    async def get(path: str) -> httpx.Response:
        return await client.get(path)

    return get


async def test_reads_capacity_ranks_and_interval_hit_rate_from_a_vllm_server(vllm_twin: httpx.AsyncClient) -> None:
    adapter, get = VLLM(), _fetch(vllm_twin)
    info, error = await adapter.read_info(get)
    assert error is None
    assert (info.dp_ranks, info.max_running_requests) == (2, 0)  # vLLM publishes no running cap
    assert info.kv_tokens == get_profile("b300-dp2-bf16").kv_tokens  # per engine, not the API server's sum
    idle = await adapter.read_load(get)
    assert idle is not None and (idle.ranks, idle.running, idle.cache_hit_rate) == (2, 0, 0.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 2}
    for _ in range(2):  # the same prompt twice on one rank: the second is a prefix-cache hit
        assert (await vllm_twin.post("/v1/chat/completions", json=body, headers={RANK_HEADER: "0"})).status_code == 200
    load = await adapter.read_load(get)
    assert load is not None and 0.3 < load.cache_hit_rate < 1.0
    again = await adapter.read_load(get)  # nothing queried since: the totals' ratio
    assert again is not None and again.cache_hit_rate == pytest.approx(load.cache_hit_rate)


async def test_a_server_without_metrics_is_an_error_not_a_capacity(vllm_twin: httpx.AsyncClient) -> None:
    async def get(path: str) -> httpx.Response:
        return await vllm_twin.get("/no-such-route")

    info, error = await VLLM().read_info(get)
    assert error == "/metrics answered 404" and info.kv_tokens == 0
    with pytest.raises(ValueError, match="404"):
        await VLLM().read_load(get)
