"""vLLM 0.33.0: everything from ``/metrics`` (Prometheus text), the context window from ``/v1/models``
(the pool reads each card's ``max_model_len``), a DP rank pinned by the header ``X-data-parallel-rank``.

Series read (names, labels and types as ``vllm/v1/metrics/loggers.py`` declares them; every series has
the labels ``model_name`` and ``engine``, one ``engine`` value per DP rank behind this API server):

- ``vllm:cache_config_info`` (gauge set to 1; labels: every ``CacheConfig`` field as a string): per
  engine, ``kv_cache_size_tokens`` when it is a number (vLLM's group-aware capacity per DP engine),
  else ``num_gpu_blocks × block_size`` over the engines (with internal DP load balancing the API
  server's ``num_gpu_blocks`` is the sum over its engines: ``vllm/v1/engine/core_client.py``);
- ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges): summed over engines;
- ``vllm:kv_cache_usage_perc`` (gauge, 1 = full): the fullest engine;
- ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (counters, tokens): the hit rate over the
  last poll interval (hits / queries of the increments; the totals' ratio at the first poll and when
  nothing was queried since).

vLLM publishes no running cap (``max_num_seqs`` is not among its metrics): ``max_running_requests``
stays 0 (no seat-count limit), and admission sizes seats by tokens alone.
"""

from __future__ import annotations

from collections import defaultdict
from typing import ClassVar

from prometheus_client.parser import text_string_to_metric_families

from backends.engines.base import READ_ERRORS, EngineAdapter, Fetch, Info, Load

RANK_HEADER = "x-data-parallel-rank"
"""vLLM's ``_get_data_parallel_rank`` reads ``X-data-parallel-rank`` (HTTP headers are case-free)."""
READ = (
    "vllm:cache_config_info",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)
"""The families the adapter reads (a test checks each against vLLM's own declarations)."""


class Scrape:
    """One ``/metrics`` answer, per engine (DP rank)."""

    def __init__(self, text: str) -> None:
        self.values: dict[str, dict[str, float]] = defaultdict(dict)
        self.cache_info: dict[str, dict[str, str]] = {}
        # vLLM's /metrics runs to hundreds of series (histogram buckets): parse only the families read,
        # once a second per backend on the gateway's loop.
        kept = "\n".join(ln for ln in text.splitlines() if ln.startswith(READ) or _describes(ln))
        for family in text_string_to_metric_families(kept + "\n"):
            if family.name not in READ:
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                engine = sample.labels.get("engine", "0")
                if family.name == "vllm:cache_config_info":
                    self.cache_info[engine] = dict(sample.labels)
                else:
                    self.values[family.name][engine] = float(sample.value)

    @property
    def engines(self) -> int:
        return len(self.cache_info) or len(self.values.get("vllm:num_requests_running", {}))

    def kv_tokens(self) -> int:
        """KV tokens per engine (0: not published)."""
        for labels in self.cache_info.values():
            per_engine = _int(labels.get("kv_cache_size_tokens"))
            if per_engine:
                return per_engine
            blocks, size = _int(labels.get("num_gpu_blocks")), _int(labels.get("block_size"))
            if blocks and size:
                return blocks * size // max(1, len(self.cache_info))
        return 0

    def total(self, name: str) -> float:
        return sum(self.values.get(name, {}).values())


def _describes(line: str) -> bool:
    """A ``# HELP`` or ``# TYPE`` line of a family the adapter reads."""
    parts = line.split(" ", 3)
    return len(parts) > 2 and parts[0] == "#" and parts[2].startswith(READ)


def _int(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:  # "None" before the engine has profiled its memory
        return 0


def parse_info(scrape: Scrape) -> Info:
    return Info(kv_tokens=scrape.kv_tokens(), dp_ranks=scrape.engines or None)


class VLLM(EngineAdapter):
    name: ClassVar[str] = "vllm"
    native_surfaces: ClassVar[frozenset[str]] = frozenset({"responses", "messages"})
    info_route: ClassVar[str] = "/metrics"

    def __init__(self) -> None:
        self._counted: tuple[float, float] | None = None
        """``(queries, hits)`` totals at the previous poll."""

    async def _scrape(self, get: Fetch) -> Scrape:
        response = await get("/metrics")
        if response.status_code != 200:
            raise ValueError(f"/metrics answered {response.status_code}")
        return Scrape(response.content.decode("utf-8", errors="replace"))

    async def read_info(self, get: Fetch) -> tuple[Info, str | None]:
        try:
            scrape = await self._scrape(get)
        except READ_ERRORS as exc:
            return Info(), str(exc) or type(exc).__name__
        if not scrape.cache_info:
            return parse_info(scrape), "/metrics has no vllm:cache_config_info"
        return parse_info(scrape), None

    async def read_load(self, get: Fetch) -> Load | None:
        scrape = await self._scrape(get)
        if not scrape.engines:
            return None
        return self.load_of(scrape)

    def load_of(self, scrape: Scrape) -> Load:
        queries, hits = scrape.total("vllm:prefix_cache_queries"), scrape.total("vllm:prefix_cache_hits")
        before = self._counted if self._counted and self._counted[0] <= queries else (0.0, 0.0)
        self._counted = (queries, hits)
        asked = queries - before[0]
        usage = scrape.values.get("vllm:kv_cache_usage_perc", {})
        return Load(
            running=int(scrape.total("vllm:num_requests_running")),
            waiting=int(scrape.total("vllm:num_requests_waiting")),
            token_usage=max(usage.values(), default=0.0),
            cache_hit_rate=(hits - before[1]) / asked if asked > 0 else (hits / queries if queries else 0.0),
            kv_tokens=scrape.kv_tokens(),
            ranks=scrape.engines,
        )

    def pin(self, rank: int | None) -> tuple[int | None, dict[str, str]]:
        return None, ({RANK_HEADER: str(rank)} if rank is not None else {})
