"""The cachegate / Teams dashboard: per-team concurrency, queueing, token use, refusals and latency."""

from __future__ import annotations

from deploy.grafana.model import Dash, Panel, Query, Row, quantile, rate

TEAMS = Dash(
    uid="cachegate-teams",
    title="cachegate / Teams",
    description="Per-team concurrency, queueing, token use, refusals and latency: is every team served fairly?",
    rows=(
        Row(
            "Load",
            (
                Panel(
                    "In flight by team",
                    "Requests each team has running upstream (summed over replicas).",
                    (Query("sum by (team) (cachegate_inflight_requests)", "{{team}}"),),
                ),
                Panel(
                    "Queued by team",
                    "Requests each team has waiting at the gateway.",
                    (Query("sum by (team) (cachegate_queued_requests)", "{{team}}"),),
                ),
                Panel(
                    "Tokens per minute by team",
                    "Input, cached and output tokens per team.",
                    (Query(f"{rate('cachegate_tokens_total', 'team, kind')} * 60", "{{team}} {{kind}}"),),
                ),
                Panel(
                    "Requests per second by team",
                    "Completed requests per team and status.",
                    (Query(rate("cachegate_requests_total", "team, status"), "{{team}} {{status}}"),),
                    unit="reqps",
                ),
            ),
        ),
        Row(
            "Experience",
            (
                Panel(
                    "TTFT p95 by team",
                    "Time to first token per team; exemplars link to traces.",
                    (Query(quantile(0.95, "cachegate_ttft_seconds", "team"), "{{team}}"),),
                    unit="s",
                    exemplars=True,
                ),
                Panel(
                    "Oldest wait vs bound by team",
                    "Each team's oldest waiting request, its expected wait and its max_wait_s: the oldest "
                    "wait staying under the bound is what the admission core plans for (alert CachegateWaitPastBound).",
                    (
                        Query("max by (team) (cachegate_oldest_wait_seconds)", "{{team}} oldest"),
                        Query("max by (team) (cachegate_expected_wait_seconds)", "{{team}} expected"),
                        Query("max by (team) (cachegate_wait_bound_seconds)", "{{team}} bound"),
                    ),
                    unit="s",
                ),
                Panel(
                    "Queue wait p95 by team",
                    "How long each team's requests wait for a slot.",
                    (Query(quantile(0.95, "cachegate_queue_wait_seconds", "team"), "{{team}}"),),
                    unit="s",
                ),
                Panel(
                    "Refusals by team",
                    "Refused requests per team and reason.",
                    (Query(rate("cachegate_admission_refusals_total", "team, reason"), "{{team}} {{reason}}"),),
                    unit="reqps",
                    width=24,
                ),
            ),
        ),
    ),
)
