"""The gateway's Prometheus metrics. Names are part of the contract (dashboards use them).

Labels stay low-cardinality: team, model, backend, status, reason, kind. Never keys, IPs or
user agents.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 4, 8)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300, 600, 1200, 2400)
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 60, 120, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("cachegate_requests", "Requests answered, by status code.",
                                ["team", "model", "backend", "status"], registry=r)
        self.ttft = Histogram("cachegate_ttft_seconds", "Time to first generated token, from arrival.",
                              ["team", "model", "backend"], buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("cachegate_inter_token_latency_seconds",
                             "Mean time between output tokens of a stream after the first.",
                             ["team", "model", "backend"], buckets=ITL_BUCKETS, registry=r)
        self.duration = Histogram("cachegate_request_duration_seconds", "End-to-end request latency.",
                                  ["team", "model", "backend"], buckets=E2E_BUCKETS, registry=r)
        self.queue_wait = Histogram("cachegate_queue_wait_seconds", "Time spent waiting in admission.",
                                    ["team", "model"], buckets=WAIT_BUCKETS, registry=r)
        self.inflight = Gauge("cachegate_inflight_requests", "Requests dispatched and not finished.",
                              ["team"], registry=r)
        self.queued = Gauge("cachegate_queued_requests", "Requests waiting in admission.", ["team"],
                            registry=r)
        self.tokens = Counter("cachegate_tokens", "Tokens by kind (input includes cached).",
                              ["team", "model", "kind"], registry=r)
        self.refusals = Counter("cachegate_admission_refusals", "Requests refused by admission.",
                                ["team", "reason"], registry=r)
        self.routes = Counter("cachegate_route_decisions", "Routing decisions by reason.",
                              ["model", "backend", "reason"], registry=r)
        self.upstream_errors = Counter("cachegate_upstream_errors", "Failures talking to a backend.",
                                       ["backend", "kind"], registry=r)
        self.backend_healthy = Gauge("cachegate_backend_healthy", "1 when the backend is in rotation.",
                                     ["backend"], registry=r)
        self.backend_breaker = Gauge("cachegate_backend_breaker_state",
                                     "Circuit breaker: 0 closed, 1 half-open, 2 open.", ["backend"],
                                     registry=r)
        self.backend_kv = Gauge("cachegate_backend_kv_usage", "KV token usage as last polled (0-1).",
                                ["backend"], registry=r)
        self.backend_running = Gauge("cachegate_backend_running", "Running requests as last polled.",
                                     ["backend"], registry=r)
        self.backend_waiting = Gauge("cachegate_backend_waiting", "Waiting requests as last polled.",
                                     ["backend"], registry=r)
        self.backend_hit = Gauge("cachegate_backend_cache_hit_rate", "Prefix cache hit rate as last polled.",
                                 ["backend"], registry=r)
        self.redis_degraded = Gauge("cachegate_redis_degraded",
                                    "1 when Redis is unreachable and limits are split per replica.",
                                    registry=r)
