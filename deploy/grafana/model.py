"""Typed panel declarations (Dash/Row/Panel/Query) and the PromQL helpers the dashboards are written with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
