"""The ``vllm:`` Prometheus metrics of one simulated vLLM 0.33.0 server (``sim-backend --engine vllm``).

Names, kinds and label names are vLLM's (``vllm/v1/metrics/loggers.py``; a test checks each against
that file): every series has ``model_name`` and ``engine`` (the DP rank), and ``vllm:cache_config_info``
is a gauge set to 1 whose labels are ``CacheConfig`` fields as strings. As behind vLLM's API server with
internal DP load balancing, ``num_gpu_blocks`` is the sum over the engines and ``kv_cache_size_tokens``
the figure of one engine. Scheduler gauges are read from the engine at scrape time (vLLM refreshes them
every scheduler step); the prefix-cache and token counters are server totals, on engine ``0``; request
histograms too (the twin does not track which rank served a request past the engine). Durations are
simulated seconds, as in ``metrics.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.sim.metrics import E2E_BUCKETS, TTFT_BUCKETS, SchedulerSnapshot

BLOCK_SIZE = 16
"""vLLM's default KV block size on CUDA (tokens per block, the unit of its prefix cache)."""
CACHE_CONFIG = {
    "cache_dtype": "auto",
    "enable_prefix_caching": "True",
    "prefix_caching_hash_algo": "sha256",
    "gpu_memory_utilization": "0.9",
    "is_attention_free": "False",
    "num_gpu_blocks_override": "None",
    "sliding_window": "None",
    "num_cpu_blocks": "None",
    "hash_block_size": "16",
}
"""The ``CacheConfig`` labels besides the capacity ones (values as ``str()`` of vLLM's defaults)."""
FINISHED_REASONS = ("stop", "length", "abort")


class _SchedulerCollector(Collector):
    def __init__(self, model: str, snapshot: Callable[[], SchedulerSnapshot]) -> None:
        self.model, self.snapshot = model, snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        names = ["model_name", "engine"]
        per_rank = [(ld, [self.model, str(ld.dp_rank)]) for ld in snap.loads]
        blocks = [ld.max_total_num_tokens // BLOCK_SIZE for ld in snap.loads]
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*CACHE_CONFIG, "block_size", "num_gpu_blocks", "kv_cache_size_tokens", "engine"],
        )
        for (_, lab), own in zip(per_rank, blocks, strict=True):
            values = [*CACHE_CONFIG.values(), str(BLOCK_SIZE), str(sum(blocks)), str(own * BLOCK_SIZE), lab[1]]
            info.add_metric(values, 1.0)
        yield info

        def gauge(name: str, doc: str, value: Callable[[int], float]) -> GaugeMetricFamily:
            fam = GaugeMetricFamily(name, doc, labels=names)
            for i, (_, lab) in enumerate(per_rank):
                fam.add_metric(lab, value(i))
            return fam

        loads = snap.loads
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    lambda i: loads[i].num_running_reqs)  # fmt: skip
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    lambda i: loads[i].num_waiting_reqs)  # fmt: skip
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    lambda i: loads[i].token_usage)  # fmt: skip
        c = snap.counters

        def counter(name: str, doc: str, total: float) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=names)
            for i, (_, lab) in enumerate(per_rank):
                fam.add_metric(lab, float(total) if i == 0 else 0.0)
            return fam

        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      c.prompt_tokens)  # fmt: skip
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      c.cached_tokens)  # fmt: skip
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens)


class VllmMetrics:
    """All ``vllm:`` metrics of one twin, in a registry of its own (``TwinMetrics``' interface)."""

    def __init__(self, model: str, snapshot: Callable[[], SchedulerSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"model_name": model, "engine": "0"}
        base = list(self.labels)
        reg = self.registry
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*base, "finished_reason"],
            registry=reg,
        )  # fmt: skip
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", base,
            buckets=TTFT_BUCKETS, registry=reg,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", base,
            buckets=E2E_BUCKETS, registry=reg,
        )  # fmt: skip
        for reason in FINISHED_REASONS:
            self.success.labels(**self.labels, finished_reason=reason)
        reg.register(_SchedulerCollector(model, snapshot))

    def first_token(self, ttft_s: float, stream: bool) -> None:
        self.ttft.labels(**self.labels).observe(ttft_s)

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
        self.e2e.labels(**self.labels).observe(e2e_s)
        if not aborted:
            self.success.labels(**self.labels, finished_reason="stop").inc()
