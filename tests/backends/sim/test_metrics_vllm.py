"""backends/sim/metrics_vllm.py: the twin's ``vllm:`` series from a hand-made snapshot: the cache-config
info gauge per engine (blocks summed over engines, one engine's tokens), scheduler gauges per engine,
totals on engine 0, and what a finished request adds. Names, kinds and labels against vLLM's source:
tests/backends/test_twin_vllm.py."""

from __future__ import annotations

from backends.sim.engine import EngineCounters, RankLoad
from backends.sim.metrics import SchedulerSnapshot
from backends.sim.metrics_vllm import BLOCK_SIZE, CACHE_CONFIG, FINISHED_REASONS, VllmMetrics


def _load(rank: int, capacity: int) -> RankLoad:
    return RankLoad(rank, rank + 1, 2 * rank, 10, capacity, 0.1 * (rank + 1), 0.0, 0.0, 64)


def _metrics(*capacities: int, counters: EngineCounters | None = None) -> VllmMetrics:
    snap = SchedulerSnapshot([_load(r, c) for r, c in enumerate(capacities)], counters or EngineCounters(), 1)
    return VllmMetrics("m", lambda: snap)


def test_the_cache_config_info_sums_blocks_over_engines_and_gives_one_engines_tokens() -> None:
    reg = _metrics(1000, 1000).registry  # 1000 tokens: 62 whole blocks of 16
    for engine in ("0", "1"):
        labels = {
            **CACHE_CONFIG,
            "block_size": "16",
            "num_gpu_blocks": "124",
            "kv_cache_size_tokens": "992",
            "engine": engine,
        }
        assert reg.get_sample_value("vllm:cache_config_info", labels) == 1.0
    assert BLOCK_SIZE == 16


def test_scheduler_gauges_per_engine() -> None:
    reg = _metrics(4096, 4096, 4096).registry
    for rank in range(3):
        labels = {"model_name": "m", "engine": str(rank)}
        assert reg.get_sample_value("vllm:num_requests_running", labels) == rank + 1
        assert reg.get_sample_value("vllm:num_requests_waiting", labels) == 2 * rank
        assert reg.get_sample_value("vllm:kv_cache_usage_perc", labels) == 0.1 * (rank + 1)


def test_token_and_prefix_cache_totals_are_on_engine_zero() -> None:
    counters = EngineCounters(prompt_tokens=500, cached_tokens=300, generation_tokens=70)
    reg = _metrics(4096, 4096, counters=counters).registry
    zero, one = {"model_name": "m", "engine": "0"}, {"model_name": "m", "engine": "1"}
    assert reg.get_sample_value("vllm:prefix_cache_queries_total", zero) == 500
    assert reg.get_sample_value("vllm:prefix_cache_hits_total", zero) == 300
    assert reg.get_sample_value("vllm:prompt_tokens_total", zero) == 500
    assert reg.get_sample_value("vllm:generation_tokens_total", zero) == 70
    for name in ("prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens"):
        assert reg.get_sample_value(f"vllm:{name}_total", one) == 0.0


def test_a_finished_request_counts_as_a_success_unless_aborted_and_adds_its_latencies() -> None:
    m = _metrics(4096)
    reg, base = m.registry, {"model_name": "m", "engine": "0"}
    for reason in FINISHED_REASONS:
        assert reg.get_sample_value("vllm:request_success_total", {**base, "finished_reason": reason}) == 0
    m.first_token(0.5, stream=True)
    m.finished(
        prompt_tokens=5, completion_tokens=3, cached_tokens=0, e2e_s=1.5, decode_s=1.0, stream=True, aborted=False
    )
    m.finished(
        prompt_tokens=5, completion_tokens=0, cached_tokens=0, e2e_s=0.2, decode_s=None, stream=False, aborted=True
    )
    assert reg.get_sample_value("vllm:request_success_total", {**base, "finished_reason": "stop"}) == 1
    assert reg.get_sample_value("vllm:request_success_total", {**base, "finished_reason": "abort"}) == 0
    assert reg.get_sample_value("vllm:time_to_first_token_seconds_count", base) == 1
    assert reg.get_sample_value("vllm:time_to_first_token_seconds_sum", base) == 0.5
    assert reg.get_sample_value("vllm:e2e_request_latency_seconds_count", base) == 2
    assert reg.get_sample_value("vllm:e2e_request_latency_seconds_sum", base) == 1.7
