"""The gateway's Prometheus metrics. Names are part of the contract (dashboards use them).

Labels stay low-cardinality: team, model, backend, status, reason, kind. Never keys, IPs or
user agents.

Exposition (``/metrics``): OpenMetrics when the scraper's ``Accept`` asks for it (Prometheus does,
and only OpenMetrics carries exemplars), the classic text format otherwise. The latency histograms
(TTFT, inter-token, end-to-end, queue wait) carry an exemplar ``{trace_id=...}`` from sampled
requests, so a dashboard point leads to its trace.

Several workers (``cachegate serve --workers N``): ``gateway.serve`` points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before the workers start; each worker then writes
its samples to memory-mapped files there and ``/metrics`` (whichever worker answers) merges all
of them with ``MultiProcessCollector``, so counters are totals over workers (dead ones included).
Gauges say how to merge: per-team in-flight and queued are summed over live workers, backend state
is the most recent value any live worker polled, Redis degraded is the max. **Multiprocess mode
has no exemplars** (prometheus-client does not store them across processes): run one worker per
container and scale with replicas when you want exemplars.

Updates are batched (:class:`_Batched`): a request adds to plain numbers, pushed into
prometheus-client's values before every collection and exposition, at shutdown, and, in a worker of
several, every ``Metrics.FLUSH_S`` (0.5 s): a sibling's scrape sees a worker's counts that much
later, and a worker killed outright loses at most its last half second of them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, get_args

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway.observability.metric_values import Counter, Gauge, Histogram, LocalHistogram, flush
from policies.types import RefusalCode

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
REFUSAL_REASONS: tuple[str, ...] = get_args(RefusalCode)  # the codes are defined once, in policies/types.py
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "status_5xx", "stream_broken", "malformed")

TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 4, 8)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300, 600, 1200, 2400)


WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300)


def multiprocess_dir() -> str | None:
    """The multiprocess directory when this process runs in multiprocess mode."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def prepare_multiprocess_dir() -> str:
    """Call in the parent before starting workers: a fresh multiprocess directory (removed at exit),
    or the one ``PROMETHEUS_MULTIPROC_DIR`` names, emptied of a previous run's files."""
    given = multiprocess_dir()
    if given:
        Path(given).mkdir(parents=True, exist_ok=True)
        for stale in Path(given).glob("*.db"):
            stale.unlink(missing_ok=True)
        return given
    path = tempfile.mkdtemp(prefix="cachegate-metrics-")
    os.environ[MULTIPROC_ENV] = path
    atexit.register(shutil.rmtree, path, True)
    return path


_LIVE_FILE = re.compile(r"^gauge_live\w+?_(\d+)\.db$")


def reap_dead_workers(path: str) -> list[int]:
    """Drop the live-gauge files of worker processes that no longer exist (a crashed worker never
    cleans up after itself; its counters stay, as totals must). Returns the pids reaped."""
    dead: set[int] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            match = _LIVE_FILE.match(name)
            if match and not _alive(int(match.group(1))):
                dead.add(int(match.group(1)))
    for pid in dead:
        multiprocess.mark_process_dead(pid, path)
    return sorted(dead)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Metrics:
    """One worker's metrics. In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before the first
    metric is made) the samples live in that directory's files and :meth:`exposition` merges them."""

    FLUSH_S = 0.5
    """How often a worker of several pushes its batched updates to its files (see :func:`flush`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir()
        self._timer: asyncio.TimerHandle | None = None
        self.registry = registry or CollectorRegistry()
        r = self.registry
        histogram: Any = Histogram if self.multiprocess_dir else LocalHistogram
        self.requests = Counter(
            "cachegate_requests",
            "Requests answered, by status code.",
            ["team", "model", "backend", "status"],
            registry=r,
        )
        self.http_requests = Counter(
            "cachegate_http_requests",
            "Every HTTP request, by method, route template (or unknown) and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.ttft = histogram(
            "cachegate_ttft_seconds",
            "Time to first generated token, from arrival.",
            ["team", "model", "backend"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = histogram(
            "cachegate_inter_token_latency_seconds",
            "Mean time between output tokens of a stream after the first.",
            ["team", "model", "backend"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.duration = histogram(
            "cachegate_request_duration_seconds",
            "End-to-end request latency.",
            ["team", "model", "backend"],
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.queue_wait = histogram(
            "cachegate_queue_wait_seconds",
            "Time spent waiting in admission.",
            ["team", "model"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "cachegate_inflight_requests",
            "Requests dispatched and not finished.",
            ["team"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "cachegate_queued_requests",
            "Requests waiting in admission.",
            ["team"],
            registry=r,
            multiprocess_mode="livesum",
        )
        # Waits against the bound (policies/teams.py::TeamLimits.max_wait_s); the max over live workers.
        self.oldest_wait = Gauge(
            "cachegate_oldest_wait_seconds",
            "How long each team's oldest waiting request has waited in admission.",
            ["team"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.expected_wait = Gauge(
            "cachegate_expected_wait_seconds",
            "Expected wait in admission of a request of the team arriving now.",
            ["team"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.wait_bound = Gauge(
            "cachegate_wait_bound_seconds",
            "The team's max_wait_s: the wait bound admission plans for.",
            ["team"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.tokens = Counter(
            "cachegate_tokens", "Tokens by kind (input includes cached).", ["team", "model", "kind"], registry=r
        )
        self.refusals = Counter(
            "cachegate_admission_refusals", "Requests refused by admission.", ["team", "reason"], registry=r
        )
        self.routes = Counter(
            "cachegate_route_decisions", "Routing decisions by reason.", ["model", "backend", "reason"], registry=r
        )
        self.upstream_errors = Counter(
            "cachegate_upstream_errors", "Failures talking to a backend.", ["backend", "kind"], registry=r
        )
        self.backend_healthy = Gauge(
            "cachegate_backend_healthy",
            "1 when the backend is in rotation.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_breaker = Gauge(
            "cachegate_backend_breaker_state",
            "Circuit breaker: 0 closed, 1 half-open, 2 open.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_kv = Gauge(
            "cachegate_backend_kv_usage",
            "KV token usage as last polled (0-1).",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_running = Gauge(
            "cachegate_backend_running",
            "Running requests as last polled.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_waiting = Gauge(
            "cachegate_backend_waiting",
            "Waiting requests as last polled.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.backend_hit = Gauge(
            "cachegate_backend_cache_hit_rate",
            "Prefix cache hit rate as last polled.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        self.redis_degraded = Gauge(
            "cachegate_redis_degraded",
            "1 when Redis is unreachable and limits are split per replica.",
            registry=r,
            multiprocess_mode="livemax",
        )

    def init_labels(self, teams: Iterable[str], backends: Iterable[str]) -> None:
        """Export the refusal and upstream-error series at zero from the start, so that ``rate()``
        sees the first event as an increase instead of a series appearing at 1."""
        for team in teams:
            for reason in REFUSAL_REASONS:
                self.refusals.labels(team, reason)
        for backend in backends:
            for kind in UPSTREAM_ERROR_KINDS:
                self.upstream_errors.labels(backend, kind)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The ``/metrics`` body and its content type, in the format ``accept`` asks for."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.exposed), content_type

    @functools.cached_property
    def exposed(self) -> CollectorRegistry:
        """What a scrape reads: this worker's registry, or in multiprocess mode every worker's files
        merged; batched updates flushed first (prometheus-client's ASGI app serves it on the metrics port)."""
        exposed = CollectorRegistry(auto_describe=False)
        exposed.register(_Scrape(self))
        return exposed

    def start(self) -> None:
        """In a worker of several, flush every ``FLUSH_S``: ``/metrics`` may be answered by a sibling,
        which reads this worker's files (so a sibling's view lags by at most that)."""
        if self.multiprocess_dir is None or self._timer is not None:
            return
        loop = asyncio.get_running_loop()

        def tick() -> None:
            flush()
            self._timer = loop.call_later(self.FLUSH_S, tick)

        self._timer = loop.call_later(self.FLUSH_S, tick)

    def close(self) -> None:
        """A worker shutting down: its live gauges stop counting (its counters stay)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        flush()
        if self.multiprocess_dir is not None:
            multiprocess.mark_process_dead(os.getpid(), self.multiprocess_dir)


class _Scrape(Collector):
    """One scrape of a worker's metrics: batched updates flushed, then its registry's samples, or in
    multiprocess mode every worker's files merged (dead workers' live gauges reaped first)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        flush()
        path = self.metrics.multiprocess_dir
        if path is None:
            yield from self.metrics.registry.collect()
            return
        reap_dead_workers(path)
        yield from multiprocess.MultiProcessCollector(None, path).collect()
