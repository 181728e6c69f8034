"""The ``sglang:`` Prometheus metrics of one simulated server, as SGLang 0.5.23 names them.

Two halves, as in SGLang:
- tokenizer metrics (per request, labels ``model_name, engine_type`` plus ``is_streaming`` or
  ``cache_source`` where 0.5.23 has them): real prometheus-client counters and histograms,
  observed by the HTTP layer when a request finishes;
- scheduler metrics (per rank, labels ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``
  and ``dp_rank`` under DP attention): read from the engine at scrape time by a custom collector.
  SGLang refreshes them every decode-log interval; the twin's are current at every scrape.

Each twin owns its own :class:`CollectorRegistry`, so several twins can run in one process.
Durations are simulated seconds (wall seconds / time scale), so a time-scaled twin reports the
latencies of the hardware it simulates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.sim.engine import EngineCounters, RankLoad

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
ENGINE_TYPE = "unified"  # DisaggregationMode.to_engine_type("null")
ITL_MAX_OBSERVATIONS = 4096
"""Cap on the per-request inter-token observations (SGLang weights one per token)."""


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    loads: list[RankLoad]
    counters: EngineCounters
    tp_size: int


class _SchedulerCollector(Collector):
    """Scheduler-side gauges and counters, computed from the engine at each scrape."""

    def __init__(self, model: str, snapshot: Callable[[], SchedulerSnapshot]) -> None:
        self.model = model
        self.snapshot = snapshot

    def _labels(self, rank: int, dp: bool, tp_per_rank: int) -> dict[str, str]:
        labels = {
            "model_name": self.model,
            "engine_type": ENGINE_TYPE,
            "tp_rank": str(rank * tp_per_rank),
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        if dp:
            labels["dp_rank"] = str(rank)
        return labels

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        dp = len(snap.loads) > 1
        tp_per_rank = max(1, snap.tp_size // max(1, len(snap.loads)))
        per_rank = [(ld, self._labels(ld.dp_rank, dp, tp_per_rank)) for ld in snap.loads]
        names = list(per_rank[0][1]) if per_rank else []

        def gauge(name: str, doc: str, value: Callable[[RankLoad], float]) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(f"sglang:{name}", doc, labels=names)
            for ld, lab in per_rank:
                fam.add_metric(list(lab.values()), float(value(ld)))
            return fam

        yield gauge("num_running_reqs", "The number of running requests.", lambda x: x.num_running_reqs)
        yield gauge("num_queue_reqs", "The number of requests in the waiting queue.", lambda x: x.num_waiting_reqs)
        yield gauge("num_used_tokens", "The number of used tokens.", lambda x: x.num_used_tokens)
        yield gauge("token_usage", "The token usage.", lambda x: x.token_usage)
        yield gauge(
            "max_total_num_tokens",
            "Maximum total number of tokens in the KV cache pool.",
            lambda x: x.max_total_num_tokens,
        )
        yield gauge("gen_throughput", "The generation throughput (token/s).", lambda x: x.gen_throughput)
        yield gauge("cache_hit_rate", "The prefix cache hit rate.", lambda x: x.cache_hit_rate)
        yield gauge(
            "num_retracted_reqs", "The number of retracted requests.", lambda x: x.extra.get("num_retracted_reqs", 0.0)
        )

        # Engine counters are server totals: reported on the first rank's series.
        c = snap.counters
        first = list(per_rank[0][1].values()) if per_rank else []

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            fam = CounterMetricFamily(f"sglang:{name}", doc, labels=names)
            fam.add_metric(first, float(value))
            return fam

        rt = CounterMetricFamily(
            "sglang:realtime_tokens",
            "Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            labels=[*names, "mode"],
        )
        rt.add_metric([*first, "prefill_compute"], float(c.prefill_compute_tokens))
        rt.add_metric([*first, "prefill_cache"], float(c.prefill_cache_tokens))
        rt.add_metric([*first, "decode"], float(c.generation_tokens))
        yield rt
        yield counter(
            "num_retracted_requests", "Total number of retracted requests due to kvcache full.", c.retractions
        )
        yield counter("num_retracted_input_tokens", "Total number of retracted input tokens.", c.retracted_input_tokens)
        yield counter(
            "num_retracted_output_tokens", "Total number of retracted output tokens.", c.retracted_output_tokens
        )


class TwinMetrics:
    """All ``sglang:`` metrics of one twin, in a registry of its own."""

    def __init__(self, model: str, snapshot: Callable[[], SchedulerSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"model_name": model, "engine_type": ENGINE_TYPE}
        base = list(self.labels)
        reg = self.registry
        self.prompt_tokens_total = Counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", [*base, "is_streaming"], registry=reg
        )
        self.generation_tokens_total = Counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            [*base, "is_streaming"],
            registry=reg,
        )
        self.cached_tokens_total = Counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*base, "cache_source"],
            registry=reg,
        )
        self.num_requests_total = Counter(
            "sglang:num_requests_total", "Number of requests processed.", [*base, "is_streaming"], registry=reg
        )
        self.num_aborted_requests_total = Counter(
            "sglang:num_aborted_requests_total", "Number of requests aborted.", base, registry=reg
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            [*base, "is_streaming"],
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            base,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            [*base, "is_streaming"],
            buckets=E2E_BUCKETS,
            registry=reg,
        )
        reg.register(_SchedulerCollector(model, snapshot))
        # Children are created up front so that a fresh twin exposes every series at zero.
        for s in ("true", "false"):
            self.prompt_tokens_total.labels(**self.labels, is_streaming=s)
            self.generation_tokens_total.labels(**self.labels, is_streaming=s)
            self.num_requests_total.labels(**self.labels, is_streaming=s)
        self.num_aborted_requests_total.labels(**self.labels)

    def first_token(self, ttft_s: float, stream: bool) -> None:
        self.ttft.labels(**self.labels, is_streaming=_b(stream)).observe(ttft_s)

    def finished(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        e2e_s: float,
        decode_s: float | None,
        stream: bool,
        aborted: bool,
    ) -> None:
        """One request ended (as ``observe_one_finished_request`` in 0.5.23)."""
        s = _b(stream)
        self.prompt_tokens_total.labels(**self.labels, is_streaming=s).inc(prompt_tokens)
        self.generation_tokens_total.labels(**self.labels, is_streaming=s).inc(completion_tokens)
        if cached_tokens > 0:
            self.cached_tokens_total.labels(**self.labels, cache_source="total").inc(cached_tokens)
        self.num_requests_total.labels(**self.labels, is_streaming=s).inc()
        self.e2e.labels(**self.labels, is_streaming=s).observe(e2e_s)
        if aborted:
            self.num_aborted_requests_total.labels(**self.labels).inc()
        if decode_s is not None and completion_tokens > 1:
            # One observation per generated token (SGLang weights the interval by its tokens).
            per_token = decode_s / (completion_tokens - 1)
            child = self.itl.labels(**self.labels)
            for _ in range(min(completion_tokens - 1, ITL_MAX_OBSERVATIONS)):
                child.observe(per_token)


def _b(flag: bool) -> str:
    return "true" if flag else "false"
