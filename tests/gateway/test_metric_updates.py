"""gateway/metrics.py's short way for a child's updates changes the same samples prometheus-client would."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from gateway import metrics


def _samples(registry: CollectorRegistry) -> list[tuple[str, str, float, object]]:
    return sorted(
        (
            (s.name, repr(sorted(s.labels.items())), s.value, s.exemplar and (s.exemplar.labels, s.exemplar.value))
            for m in registry.collect()
            for s in m.samples
            if not s.name.endswith("_created")
        ),
        key=repr,
    )


def _drive(counter: type, gauge: type, histogram: type) -> CollectorRegistry:
    r = CollectorRegistry()
    c = counter("c", "c", ["team"], registry=r)
    g = gauge("g", "g", ["team"], registry=r)
    h = histogram("h", "h", ["team"], buckets=(0.1, 1, 10), registry=r)
    plain = counter("p", "p", registry=r)
    for team, x in (("a", 0.05), ("a", 0.5), ("b", 5.0), ("a", 50.0), ("b", 1.0)):
        c.labels(team).inc()
        c.labels(team).inc(3)
        g.labels(team).inc()
        g.labels(team).dec(0.5)
        h.labels(team).observe(x)
        plain.inc(2)
    c.labels("a").inc(1, {"trace_id": "abc"})
    h.labels("b").observe(0.2, {"trace_id": "def"})
    return r


def test_a_childs_updates_match_prometheus_client() -> None:
    ours = _drive(metrics.Counter, metrics.Gauge, metrics.Histogram)
    theirs = _drive(prometheus_client.Counter, prometheus_client.Gauge, prometheus_client.Histogram)
    assert _samples(ours) == _samples(theirs)
    assert any(s[3] is not None for s in _samples(ours))  # the exemplars went through


def test_the_checks_still_hold() -> None:
    r = CollectorRegistry()
    with pytest.raises(ValueError):
        metrics.Counter("c", "c", ["team"], registry=r).inc()  # a parent
    with pytest.raises(ValueError):
        metrics.Counter("d", "d", ["team"], registry=r).labels("a").inc(-1)
    with pytest.raises(ValueError):
        metrics.Histogram("h", "h", ["team"], registry=r).observe(1.0)
