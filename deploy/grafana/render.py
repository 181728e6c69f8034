"""Turn a Dash declaration into Grafana dashboard JSON with Grafana Labs' foundation SDK."""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gdash
from grafana_foundation_sdk.builders import prometheus as gprom
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType, DataSourceRef

from deploy.grafana.model import Dash, Panel, Query

# The data source uid provisioned in grafana/provisioning/datasources/datasources.yaml.
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="prometheus")


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
