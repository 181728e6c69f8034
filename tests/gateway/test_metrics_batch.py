"""Batched counters and gauges and one process's histograms (``gateway/observability/metric_values.py``, ``_Batched``,
``LocalHistogram``): what a scrape shows is what prometheus-client's own metrics would have shown,
series by series, exemplars included."""

from __future__ import annotations

import asyncio
import random

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gateway.observability import metric_values
from gateway.observability.metric_values import Counter, Gauge, LocalHistogram
from gateway.observability.metrics import TTFT_BUCKETS, Metrics


def _scrape(registry: CollectorRegistry) -> dict[str, float]:
    """Each series of the text exposition and its value; a ``_created`` one's value (its time of
    birth) as 0."""
    lines = generate_latest(registry).decode().splitlines()
    series = dict(ln.rsplit(" ", 1) for ln in lines if not ln.startswith("#"))
    return {name: 0.0 if "_created" in name else float(value) for name, value in series.items()}


def _pair() -> tuple[CollectorRegistry, CollectorRegistry, tuple[Counter, Gauge, LocalHistogram], tuple[object, ...]]:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    labels = ["team"]
    batched = (
        Counter("c", "a counter", labels, registry=ours),
        Gauge("g", "a gauge", labels, registry=ours),
        LocalHistogram("h", "a histogram", labels, buckets=TTFT_BUCKETS, registry=ours),
    )
    plain = (
        prometheus_client.Counter("c", "a counter", labels, registry=theirs),
        prometheus_client.Gauge("g", "a gauge", labels, registry=theirs),
        prometheus_client.Histogram("h", "a histogram", labels, buckets=TTFT_BUCKETS, registry=theirs),
    )
    return ours, theirs, batched, plain


def test_batched_updates_scrape_as_prometheus_clients_own() -> None:
    ours, theirs, (c, g, h), (pc, pg, ph) = _pair()
    rng = random.Random(7)
    # bounds themselves (le is inclusive), values between them, past the last bound, and zero
    amounts = [*TTFT_BUCKETS, 0.0, 500.0, *(rng.uniform(0, 450) for _ in range(300))]
    for i, amount in enumerate(amounts):
        team = ("a", "b")[i % 2]
        exemplar = {"trace_id": f"{i:032x}"} if i % 7 == 0 else None
        for metric, reference in ((h, ph), (c, pc)):
            child, ref = metric.labels(team), reference.labels(team)  # type: ignore[attr-defined]
            if metric is h:
                child.observe(amount, exemplar)
                ref.observe(amount, exemplar)
            else:
                child.inc(round(amount))
                ref.inc(round(amount))
        g.labels(team).inc(3)
        g.labels(team).dec(1)
        pg.labels(team).inc(3)  # type: ignore[attr-defined]
        pg.labels(team).dec(1)  # type: ignore[attr-defined]
        if i == 100:  # a scrape in the middle flushes; the updates after it are batched again
            assert _scrape(ours) == pytest.approx(_scrape(theirs), rel=1e-12)  # sums: added in another order
    g.labels("b").set(42)
    pg.labels("b").set(42)  # type: ignore[attr-defined]
    assert _scrape(ours) == pytest.approx(_scrape(theirs), rel=1e-12)  # sums: added in another order

    # OpenMetrics (what Prometheus scrapes): the same families, series and order
    def om_series(registry: CollectorRegistry) -> list[str]:
        return [ln.split(" # ")[0].rsplit(" ", 1)[0] for ln in generate_openmetrics(registry).decode().splitlines()]

    assert om_series(ours) == om_series(theirs)
    # exemplars: the last one per bucket; their time stamps are the update's own, so equal only in value
    ours_om = [
        ln.split(" # ")[1].rsplit(" ", 1)[0] for ln in generate_openmetrics(ours).decode().splitlines() if " # " in ln
    ]
    theirs_om = [
        ln.split(" # ")[1].rsplit(" ", 1)[0] for ln in generate_openmetrics(theirs).decode().splitlines() if " # " in ln
    ]
    assert ours_om and ours_om == theirs_om


def test_a_negative_counter_increment_is_refused_at_once() -> None:
    _, _, (c, _, _), _ = _pair()
    with pytest.raises(ValueError):
        c.labels("a").inc(-1)


def _unflushed(metric: Counter, name: str) -> float:
    """The metric's value as prometheus-client holds it (its own ``collect``, which does not flush)."""
    families = prometheus_client.Counter.collect(metric)
    return sum(s.value for f in families for s in f.samples if s.name == name)


def test_an_update_is_pending_until_flushed() -> None:
    registry = CollectorRegistry()
    counter = Counter("pending", "x", ["team"], registry=registry)
    counter.labels("a").inc(5)
    assert _unflushed(counter, "pending_total") == 0  # batched: not pushed yet
    assert registry.get_sample_value("pending_total", {"team": "a"}) == 5  # a collection flushes first
    assert not metric_values._PENDING
    assert _unflushed(counter, "pending_total") == 5


async def test_a_worker_of_several_flushes_on_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    m = Metrics(CollectorRegistry())
    monkeypatch.setattr(m, "multiprocess_dir", str(tmp_path))  # only the timer is under test
    monkeypatch.setattr(Metrics, "FLUSH_S", 0.05)
    m.requests.labels("t", "m", "b", "200").inc()
    assert _unflushed(m.requests, "cachegate_requests_total") == 0
    m.start()
    try:
        for _ in range(100):
            if _unflushed(m.requests, "cachegate_requests_total") == 1:
                break
            await asyncio.sleep(0.01)
        assert _unflushed(m.requests, "cachegate_requests_total") == 1
    finally:
        assert m._timer is not None
        m._timer.cancel()
        m._timer = None
