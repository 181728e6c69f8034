"""The cachegate / Backends dashboard: SGLang engine metrics next to the gateway's view, and routing."""

from __future__ import annotations

from deploy.grafana.model import Dash, Panel, Query, Row, quantile, rate

BACKENDS = Dash(
    uid="cachegate-backends",
    title="cachegate / Backends",
    description="Engine state from SGLang's own sglang: metrics next to the gateway's view, and routing.",
    rows=(
        Row(
            "KV cache",
            (
                Panel(
                    "KV usage (engine)",
                    "sglang:token_usage: share of the KV pool in use, per engine and DP rank.",
                    (Query("max by (instance, dp_rank) (sglang:token_usage)", "{{instance}} {{dp_rank}}"),),
                    unit="percentunit",
                ),
                Panel(
                    "KV usage (gateway view)",
                    "KV usage per backend as the gateway last polled it.",
                    (Query("max by (backend) (cachegate_backend_kv_usage)", "{{backend}}"),),
                    unit="percentunit",
                ),
                Panel(
                    "Cache hit rate (engine)",
                    "sglang:cache_hit_rate: share of prompt tokens found in the radix cache.",
                    (Query("max by (instance, dp_rank) (sglang:cache_hit_rate)", "{{instance}} {{dp_rank}}"),),
                    unit="percentunit",
                ),
                Panel(
                    "Cache hit rate (gateway view)",
                    "Cache hit rate per backend as the gateway last polled it.",
                    (Query("max by (backend) (cachegate_backend_cache_hit_rate)", "{{backend}}"),),
                    unit="percentunit",
                ),
                Panel(
                    "Prefill tokens: computed vs cached",
                    "sglang:realtime_tokens_total by mode: a rising prefill_compute share means the cache thrashes.",
                    (Query(rate("sglang:realtime_tokens_total", "mode"), "{{mode}}"),),
                    width=24,
                ),
            ),
        ),
        Row(
            "Requests",
            (
                Panel(
                    "Running and waiting (engine)",
                    "sglang:num_running_reqs and sglang:num_queue_reqs per engine.",
                    (
                        Query("sum by (instance) (sglang:num_running_reqs)", "running {{instance}}"),
                        Query("sum by (instance) (sglang:num_queue_reqs)", "waiting {{instance}}"),
                    ),
                ),
                Panel(
                    "Running and waiting (gateway view)",
                    "Running and waiting per backend as last polled.",
                    (
                        Query("max by (backend) (cachegate_backend_running)", "running {{backend}}"),
                        Query("max by (backend) (cachegate_backend_waiting)", "waiting {{backend}}"),
                    ),
                ),
                Panel(
                    "Generation throughput",
                    "sglang:gen_throughput: decode tokens per second per engine.",
                    (Query("sum by (instance) (sglang:gen_throughput)", "{{instance}}"),),
                ),
                Panel(
                    "TTFT p95 by backend",
                    "Time to first token through each backend; exemplars link to traces.",
                    (
                        Query(quantile(0.95, "cachegate_ttft_seconds", "backend"), "gateway {{backend}}"),
                        Query(quantile(0.95, "sglang:time_to_first_token_seconds", "instance"), "engine {{instance}}"),
                    ),
                    unit="s",
                    exemplars=True,
                ),
            ),
        ),
        Row(
            "Routing and health",
            (
                Panel(
                    "Routing share",
                    "Share of routing decisions that went to each backend.",
                    (
                        Query(
                            f"{rate('cachegate_route_decisions_total', 'backend')} / ignoring(backend) group_left "
                            f"{rate('cachegate_route_decisions_total')}",
                            "{{backend}}",
                        ),
                    ),
                    unit="percentunit",
                ),
                Panel(
                    "Route reasons",
                    "Why requests went where they did (prefix, cold_hash, least_wait, ...).",
                    (Query(rate("cachegate_route_decisions_total", "reason"), "{{reason}}"),),
                    unit="reqps",
                ),
                Panel(
                    "Backend health and breaker",
                    "healthy (1/0) and breaker state (0 closed, 1 half-open, 2 open).",
                    (
                        Query("max by (backend) (cachegate_backend_healthy)", "healthy {{backend}}"),
                        Query("max by (backend) (cachegate_backend_breaker_state)", "breaker {{backend}}"),
                    ),
                ),
                Panel(
                    "Upstream errors by backend",
                    "Failures per backend and kind.",
                    (Query(rate("cachegate_upstream_errors_total", "backend, kind"), "{{backend}} {{kind}}"),),
                    unit="reqps",
                ),
            ),
        ),
    ),
)
