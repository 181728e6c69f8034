"""deploy/grafana: the committed dashboards are what generate.py produces, every panel query is valid
PromQL (checked by a real Prometheus) over the binding metric names, and TTFT panels show exemplars."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deploy.grafana import generate
from tests.promharness import PrometheusError, prometheus

# The gateway's metric names (binding, from the gateway's metrics contract) and SGLang's own.
GATEWAY_METRICS = {
    "cachegate_requests_total",
    "cachegate_ttft_seconds",
    "cachegate_inter_token_latency_seconds",
    "cachegate_request_duration_seconds",
    "cachegate_queue_wait_seconds",
    "cachegate_inflight_requests",
    "cachegate_queued_requests",
    "cachegate_tokens_total",
    "cachegate_admission_refusals_total",
    "cachegate_route_decisions_total",
    "cachegate_upstream_errors_total",
    "cachegate_backend_healthy",
    "cachegate_backend_breaker_state",
    "cachegate_backend_kv_usage",
    "cachegate_backend_running",
    "cachegate_backend_waiting",
    "cachegate_backend_cache_hit_rate",
    "cachegate_redis_degraded",
    "cachegate_oldest_wait_seconds",
    "cachegate_expected_wait_seconds",
    "cachegate_wait_bound_seconds",
}
SGLANG_METRICS = {
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:gen_throughput",
    "sglang:realtime_tokens_total",
    "sglang:time_to_first_token_seconds",
}
HISTOGRAMS = {
    "cachegate_ttft_seconds",
    "cachegate_inter_token_latency_seconds",
    "cachegate_request_duration_seconds",
    "cachegate_queue_wait_seconds",
    "sglang:time_to_first_token_seconds",
}


def committed(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_committed_files_equal_generator_output() -> None:
    outputs = generate.outputs()
    assert {p.name for p in outputs} >= {
        "cachegate-overview.json",
        "cachegate-teams.json",
        "cachegate-backends.json",
        "README.md",
    }
    stale = [str(p) for p, text in outputs.items() if committed(p) != text]
    assert stale == [], "run `python deploy/grafana/generate.py`"
    assert {p.name for p in generate.OUT_DIR.glob("*.json")} == {p.name for p in outputs if p.suffix == ".json"}


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b(cachegate_[a-z_]+|sglang:[a-z_]+)", expr))
    return {
        re.sub(r"_(bucket|count|sum)$", "", n) if re.sub(r"_(bucket|count|sum)$", "", n) in HISTOGRAMS else n
        for n in names
    }


def test_queries_use_known_metrics_without_padding() -> None:
    queries = generate.all_queries()
    assert {d for d, _, _ in queries} == {"cachegate-overview", "cachegate-teams", "cachegate-backends"}
    used: set[str] = set()
    for dash, panel, expr in queries:
        assert "vector(" not in expr, f"{dash}/{panel} pads with vector()"
        assert "$" not in expr, f"{dash}/{panel} uses a Grafana variable"
        names = _metric_names(expr)
        assert names, f"{dash}/{panel}: no metric in {expr}"
        assert names <= GATEWAY_METRICS | SGLANG_METRICS, f"{dash}/{panel}: unknown {names - GATEWAY_METRICS}"
        used |= names
    # Every gateway metric but the inter-token histogram is on some panel; SGLang's too.
    assert GATEWAY_METRICS - used == {"cachegate_inter_token_latency_seconds"}
    assert used >= SGLANG_METRICS


def test_dashboard_contents() -> None:
    by_dash: dict[str, list[str]] = {}
    for dash, panel, _ in generate.all_queries():
        by_dash.setdefault(dash, []).append(panel)
    overview = " ".join(by_dash["cachegate-overview"]).lower()
    for word in ("tokens per minute", "time to first token", "queue", "error", "refusals"):
        assert word in overview
    teams = " ".join(by_dash["cachegate-teams"]).lower()
    for word in ("in flight", "queued", "tokens", "refusals", "ttft", "oldest wait vs bound"):
        assert word in teams
    backend_exprs = " ".join(e for d, _, e in generate.all_queries() if d == "cachegate-backends")
    for metric in (
        "sglang:token_usage",
        "cachegate_backend_kv_usage",
        "sglang:cache_hit_rate",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "cachegate_route_decisions_total",
    ):
        assert metric in backend_exprs


def test_ttft_panels_show_exemplars_from_prometheus() -> None:
    ttft_targets = 0
    for path in generate.OUT_DIR.glob("*.json"):
        board = json.loads(path.read_text())
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                assert target["datasource"] == {"type": "prometheus", "uid": "prometheus"}
                if "cachegate_ttft_seconds" in target["expr"]:
                    ttft_targets += 1
                    assert target["exemplar"] is True, f"{path.name}/{panel['title']}"
    assert ttft_targets >= 4


def test_every_query_is_valid_promql() -> None:
    """A real Prometheus parses and evaluates each expression (no data yet, so results are empty)."""
    with prometheus([]) as prom:
        for dash, panel, expr in generate.all_queries():
            assert prom.query(expr) == [], f"{dash}/{panel}"
        assert prom.query_exemplars("cachegate_ttft_seconds_bucket", 0, 1) == []
        with pytest.raises(PrometheusError, match="bad_data"):
            prom.query("sum by (team (cachegate_requests_total)")
