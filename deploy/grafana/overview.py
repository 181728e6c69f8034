"""The cachegate / Overview dashboard: traffic, latency, queueing, errors and refusals across replicas."""

from __future__ import annotations

from deploy.grafana.model import Dash, Panel, Query, Row, quantile, rate

OVERVIEW = Dash(
    uid="cachegate-overview",
    title="cachegate / Overview",
    description="Traffic, latency, queueing, errors and refusals across all gateway replicas.",
    rows=(
        Row(
            "Traffic",
            (
                Panel(
                    "Tokens per minute",
                    "Tokens through the gateway by kind (input includes cached).",
                    (Query(f"{rate('cachegate_tokens_total', 'kind')} * 60", "{{kind}}"),),
                ),
                Panel(
                    "Requests per second by status",
                    "Completed requests, by HTTP status code.",
                    (Query(rate("cachegate_requests_total", "status"), "{{status}}"),),
                    unit="reqps",
                ),
                Panel(
                    "Cached share of input tokens",
                    "Prompt tokens the engines served from their prefix cache: the affinity at work.",
                    (
                        Query(
                            rate("cachegate_tokens_total", where='kind="cached"')
                            + " / "
                            + rate("cachegate_tokens_total", where='kind="input"'),
                            "cached / input",
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Redis degraded",
                    "1 when a replica lost Redis and team limits are split per replica.",
                    (Query("max(cachegate_redis_degraded)", "degraded"),),
                    kind="stat",
                    width=12,
                ),
            ),
        ),
        Row(
            "Latency",
            (
                Panel(
                    "Time to first token",
                    "TTFT p50 and p95; exemplar dots open the request's trace in Tempo.",
                    (
                        Query(quantile(0.5, "cachegate_ttft_seconds"), "p50"),
                        Query(quantile(0.95, "cachegate_ttft_seconds"), "p95"),
                    ),
                    unit="s",
                    exemplars=True,
                ),
                Panel(
                    "End-to-end latency",
                    "Whole request duration p50 and p95, queueing included.",
                    (
                        Query(quantile(0.5, "cachegate_request_duration_seconds"), "p50"),
                        Query(quantile(0.95, "cachegate_request_duration_seconds"), "p95"),
                    ),
                    unit="s",
                    exemplars=True,
                ),
            ),
        ),
        Row(
            "Queue",
            (
                Panel(
                    "Queued and in flight",
                    "Requests waiting at the gateway and requests running upstream.",
                    (
                        Query("sum(cachegate_queued_requests)", "queued"),
                        Query("sum(cachegate_inflight_requests)", "in flight"),
                    ),
                ),
                Panel(
                    "Queue wait",
                    "Time spent waiting in admission, p50 and p95.",
                    (
                        Query(quantile(0.5, "cachegate_queue_wait_seconds"), "p50"),
                        Query(quantile(0.95, "cachegate_queue_wait_seconds"), "p95"),
                    ),
                    unit="s",
                    exemplars=True,
                ),
            ),
        ),
        Row(
            "Errors and refusals",
            (
                Panel(
                    "Non-2xx share",
                    "Share of requests answered with a status other than 2xx.",
                    (
                        Query(
                            rate("cachegate_requests_total", where='status!~"2.."')
                            + " / "
                            + rate("cachegate_requests_total"),
                            "non-2xx",
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Upstream errors",
                    "Failures talking to engines, by kind (connect, timeout, 5xx, broken stream).",
                    (Query(rate("cachegate_upstream_errors_total", "kind"), "{{kind}}"),),
                    unit="reqps",
                ),
                Panel(
                    "Admission refusals",
                    "Requests refused before any byte was sent, by reason.",
                    (Query(rate("cachegate_admission_refusals_total", "reason"), "{{reason}}"),),
                    unit="reqps",
                ),
            ),
        ),
    ),
)
