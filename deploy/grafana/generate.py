"""Grafana dashboards for cachegate, generated with Grafana Labs' foundation SDK.

``python deploy/grafana/generate.py`` rewrites ``deploy/grafana/dashboards/*.json`` and the panel list in
``deploy/grafana/README.md``; ``tests/deploy/test_deploy_dashboards.py`` checks the committed files equal what
this module produces. Every panel is declared once below as typed data (``Dash``/``Panel``/``Query``),
so the same declarations feed the JSON, the README and ``all_queries()`` (the PromQL that the live
Prometheus test evaluates). Queries use fixed ``[1m]`` windows and no Grafana variables, so each
expression runs unchanged through Prometheus's HTTP API; none pads with ``or vector(0)``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "dashboards"
README = HERE / "README.md"
# The data source uid provisioned in grafana/provisioning/datasources/datasources.yaml.
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="prometheus")
WINDOW = "1m"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: Literal["timeseries", "stat"] = "timeseries"
    exemplars: bool = False
    """Show histogram exemplars (trace ids), which Grafana links to Tempo."""
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dash:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...] = field(default_factory=tuple)

    @property
    def filename(self) -> str:
        return f"{self.uid}.json"


def rate(metric: str, by: str = "", where: str = "") -> str:
    """``sum by (...) (rate(metric{where}[1m]))``, the shape of most panels."""
    selector = f"{metric}{{{where}}}" if where else metric
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({selector}[{WINDOW}]))"


def quantile(q: float, histogram: str, by: str = "") -> str:
    keys = f"{by}, le" if by else "le"
    return f"histogram_quantile({q}, sum by ({keys}) (rate({histogram}_bucket[{WINDOW}])))"


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

DASHBOARDS: tuple[Dash, ...] = (OVERVIEW, TEAMS, BACKENDS)


def _target(query: Query, ref: str, exemplars: bool) -> gprom.Dataquery:
    return (
        gprom.Dataquery()
        .expr(query.expr)
        .legend_format(query.legend)
        .ref_id(ref)
        .range()
        .exemplar(exemplars)
        .datasource(PROMETHEUS)
    )


def _panel(spec: Panel, panel_id: int) -> gts.Panel | gstat.Panel:
    builder: gts.Panel | gstat.Panel = gstat.Panel() if spec.kind == "stat" else gts.Panel()
    builder = (
        builder.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .unit(spec.unit)
        .datasource(PROMETHEUS)
        .height(8)
        .span(spec.width)
    )
    for i, query in enumerate(spec.queries):
        builder = builder.with_target(_target(query, chr(ord("A") + i), spec.exemplars))
    return builder


def build(spec: Dash) -> dict[str, Any]:
    """The dashboard model as plain JSON data."""
    board = (
        gdash.Dashboard(spec.title)
        .uid(spec.uid)
        .description(spec.description)
        .tags(["cachegate"])
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .readonly()
        .link(
            gdash.DashboardLink("cachegate")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["cachegate"])
            .as_dropdown(True)
            .keep_time(True)
        )
    )
    next_id = 1
    for row in spec.rows:
        board = board.with_row(gdash.Row(row.title).id(next_id))
        next_id += 1
        for panel in row.panels:
            board = board.with_panel(_panel(panel, next_id))
            next_id += 1
    data: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return data


def render(spec: Dash) -> str:
    return json.dumps(build(spec), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def readme() -> str:
    """The panel list of every dashboard, for operators (deploy/grafana/README.md)."""
    lines = [
        "# Grafana dashboards",
        "",
        "Generated by `python deploy/grafana/generate.py` (Grafana foundation SDK) into `dashboards/`;",
        "do not edit the JSON or this file by hand. Provisioned by `provisioning/` in `deploy/compose.yaml`",
        "with the Prometheus (uid `prometheus`) and Tempo (uid `tempo`) data sources; the Prometheus source",
        "turns each exemplar's `trace_id` into a link to Tempo, so a dot on a TTFT panel opens that trace.",
        "",
    ]
    for spec in DASHBOARDS:
        lines += [
            f"## {spec.title} (`{spec.filename}`)",
            "",
            spec.description,
            "",
            "| row | panel | shows | exemplars |",
            "| --- | --- | --- | --- |",
        ]
        for row in spec.rows:
            for panel in row.panels:
                lines.append(
                    f"| {row.title} | {panel.title} | {panel.description} | {'yes' if panel.exemplars else ''} |"
                )
        lines.append("")
    return "\n".join(lines)


def outputs() -> dict[Path, str]:
    """Every generated file and its content."""
    files = {OUT_DIR / spec.filename: render(spec) for spec in DASHBOARDS}
    files[README] = readme()
    return files


def all_queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every query of every panel."""
    return [
        (spec.uid, panel.title, query.expr)
        for spec in DASHBOARDS
        for row in spec.rows
        for panel in row.panels
        for query in panel.queries
    ]


def main() -> int:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in outputs().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
