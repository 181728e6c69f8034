"""backends/sim/metrics.py: the twin's ``sglang:`` series from a hand-made scheduler snapshot: every
series present at zero, what one finished request adds (cache, aborts, inter-token latency weighted
per token and capped), the per-rank scheduler gauges with ``dp_rank`` only under DP, and the engine
totals on the first rank. Names, kinds, labels and buckets against SGLang's source:
tests/backends/test_twin_fidelity.py."""

from __future__ import annotations

from prometheus_client import generate_latest

from backends.sim.engine import EngineCounters, RankLoad
from backends.sim.metrics import ITL_MAX_OBSERVATIONS, SchedulerSnapshot, TwinMetrics

BASE = {"model_name": "m", "engine_type": "unified"}


def _load(rank: int, running: int = 0) -> RankLoad:
    return RankLoad(
        dp_rank=rank,
        num_running_reqs=running,
        num_waiting_reqs=rank,
        num_used_tokens=100 * rank,
        max_total_num_tokens=65536,
        token_usage=0.5,
        cache_hit_rate=0.25,
        gen_throughput=12.0,
        max_running_requests=48,
        extra={"num_retracted_reqs": 2.0} if rank == 1 else {},
    )


def _metrics(ranks: int = 1, tp: int = 1, counters: EngineCounters | None = None) -> TwinMetrics:
    snap = SchedulerSnapshot([_load(r, running=r + 1) for r in range(ranks)], counters or EngineCounters(), tp)
    return TwinMetrics("m", lambda: snap)


def test_a_fresh_twin_exposes_its_request_series_at_zero() -> None:
    reg = _metrics().registry
    for stream in ("true", "false"):
        for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_total"):
            assert reg.get_sample_value(f"sglang:{name}", {**BASE, "is_streaming": stream}) == 0.0
    assert reg.get_sample_value("sglang:num_aborted_requests_total", BASE) == 0.0
    assert reg.get_sample_value("sglang:cached_tokens_total", {**BASE, "cache_source": "total"}) is None


def test_one_finished_request_adds_its_tokens_latency_and_per_token_intervals() -> None:
    m = _metrics()
    m.first_token(0.3, stream=True)
    m.finished(
        prompt_tokens=100, completion_tokens=11, cached_tokens=64, e2e_s=2.5, decode_s=1.0, stream=True, aborted=False
    )
    reg, s = m.registry, {**BASE, "is_streaming": "true"}
    assert reg.get_sample_value("sglang:prompt_tokens_total", s) == 100
    assert reg.get_sample_value("sglang:generation_tokens_total", s) == 11
    assert reg.get_sample_value("sglang:num_requests_total", s) == 1
    assert reg.get_sample_value("sglang:num_requests_total", {**BASE, "is_streaming": "false"}) == 0
    assert reg.get_sample_value("sglang:cached_tokens_total", {**BASE, "cache_source": "total"}) == 64
    assert reg.get_sample_value("sglang:num_aborted_requests_total", BASE) == 0
    assert reg.get_sample_value("sglang:time_to_first_token_seconds_bucket", {**s, "le": "0.4"}) == 1
    assert reg.get_sample_value("sglang:time_to_first_token_seconds_bucket", {**s, "le": "0.2"}) == 0
    assert reg.get_sample_value("sglang:e2e_request_latency_seconds_sum", s) == 2.5
    # ten intervals of 0.1 s: one observation per generated token after the first
    assert reg.get_sample_value("sglang:inter_token_latency_seconds_count", BASE) == 10
    assert reg.get_sample_value("sglang:inter_token_latency_seconds_bucket", {**BASE, "le": "0.1"}) == 10


def test_an_aborted_request_counts_as_aborted_and_without_a_first_token_adds_no_intervals() -> None:
    m = _metrics()
    m.finished(
        prompt_tokens=5, completion_tokens=0, cached_tokens=0, e2e_s=0.1, decode_s=None, stream=False, aborted=True
    )
    m.finished(
        prompt_tokens=5, completion_tokens=1, cached_tokens=0, e2e_s=0.1, decode_s=0.0, stream=False, aborted=False
    )
    reg = m.registry
    assert reg.get_sample_value("sglang:num_aborted_requests_total", BASE) == 1
    assert reg.get_sample_value("sglang:num_requests_total", {**BASE, "is_streaming": "false"}) == 2
    assert reg.get_sample_value("sglang:inter_token_latency_seconds_count", BASE) is None  # never observed


def test_inter_token_observations_are_capped_per_request() -> None:
    m = _metrics()
    m.finished(
        prompt_tokens=5, completion_tokens=10_000, cached_tokens=0, e2e_s=9.0, decode_s=8.0, stream=True, aborted=False
    )
    assert m.registry.get_sample_value("sglang:inter_token_latency_seconds_count", BASE) == ITL_MAX_OBSERVATIONS


def test_scheduler_gauges_per_rank_with_dp_rank_and_tp_rank_under_dp() -> None:
    reg = _metrics(ranks=2, tp=8).registry
    for rank in (0, 1):
        labels = {**BASE, "tp_rank": str(rank * 4), "pp_rank": "0", "moe_ep_rank": "0", "dp_rank": str(rank)}
        assert reg.get_sample_value("sglang:num_running_reqs", labels) == rank + 1
        assert reg.get_sample_value("sglang:num_queue_reqs", labels) == rank
        assert reg.get_sample_value("sglang:num_used_tokens", labels) == 100 * rank
        assert reg.get_sample_value("sglang:max_total_num_tokens", labels) == 65536
        assert reg.get_sample_value("sglang:cache_hit_rate", labels) == 0.25
        assert reg.get_sample_value("sglang:num_retracted_reqs", labels) == (2.0 if rank else 0.0)


def test_without_dp_there_is_no_dp_rank_label() -> None:
    reg = _metrics(ranks=1, tp=4).registry
    labels = {**BASE, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    assert reg.get_sample_value("sglang:num_running_reqs", labels) == 1
    assert 'dp_rank="' not in generate_latest(reg).decode()


def test_engine_totals_are_reported_once_on_the_first_ranks_series() -> None:
    counters = EngineCounters(
        prefill_compute_tokens=7,
        prefill_cache_tokens=5,
        generation_tokens=3,
        retractions=2,
        retracted_input_tokens=40,
        retracted_output_tokens=9,
    )
    reg = _metrics(ranks=2, tp=2, counters=counters).registry
    first = {**BASE, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0", "dp_rank": "0"}
    assert reg.get_sample_value("sglang:realtime_tokens_total", {**first, "mode": "prefill_compute"}) == 7
    assert reg.get_sample_value("sglang:realtime_tokens_total", {**first, "mode": "prefill_cache"}) == 5
    assert reg.get_sample_value("sglang:realtime_tokens_total", {**first, "mode": "decode"}) == 3
    assert reg.get_sample_value("sglang:num_retracted_requests_total", first) == 2
    assert reg.get_sample_value("sglang:num_retracted_input_tokens_total", first) == 40
    assert reg.get_sample_value("sglang:num_retracted_output_tokens_total", first) == 9
    second = {**first, "tp_rank": "1", "dp_rank": "1"}
    assert reg.get_sample_value("sglang:num_retracted_requests_total", second) is None


def test_the_scheduler_series_are_read_at_each_scrape_and_twins_do_not_share_a_registry() -> None:
    loads = [_load(0)]
    m = TwinMetrics("m", lambda: SchedulerSnapshot(loads, EngineCounters(), 1))
    other = _metrics()
    labels = {**BASE, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    assert m.registry.get_sample_value("sglang:num_running_reqs", labels) == 0
    loads[0] = _load(0, running=5)
    assert m.registry.get_sample_value("sglang:num_running_reqs", labels) == 5
    m.finished(
        prompt_tokens=1, completion_tokens=1, cached_tokens=0, e2e_s=0.1, decode_s=None, stream=True, aborted=False
    )
    assert other.registry.get_sample_value("sglang:num_requests_total", {**BASE, "is_streaming": "true"}) == 0


def test_an_engine_with_no_ranks_still_scrapes() -> None:
    m = TwinMetrics("m", lambda: SchedulerSnapshot([], EngineCounters(), 1))
    text = generate_latest(m.registry).decode()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert any(line.startswith("sglang:num_requests_total{") for line in samples)
    assert not any(line.startswith("sglang:num_running_reqs") for line in samples)
