"""How one worker keeps its metric values (gateway/observability/metric_values.py): label sets looked up
once, counter and gauge updates batched until ``flush``, and ``LocalHistogram``'s buckets, sums,
exemplars and series. That a scrape of these equals prometheus-client's own metrics, series by series:
tests/gateway/test_metrics_batch.py."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from gateway.observability import metric_values
from gateway.observability.metric_values import Counter, Gauge, Histogram, LocalHistogram, flush


def _held(metric: object, name: str, labels: dict[str, str]) -> float | None:
    """The value prometheus-client holds now (its own ``collect``: nothing flushed first)."""
    base = next(c for c in type(metric).__mro__ if c.__module__.startswith("prometheus_client"))
    for family in base.collect(metric):  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_a_label_set_is_looked_up_once_and_batched_by_type() -> None:
    r = CollectorRegistry()
    counter, gauge = Counter("c", "x", ["team"], registry=r), Gauge("g", "x", ["team"], registry=r)
    histogram = Histogram("h", "x", ["team"], registry=r, buckets=(1, 2))
    assert counter.labels("a") is counter.labels("a") and counter.labels("a") is not counter.labels("b")
    assert type(counter.labels("a")).__name__ == "_CounterBatch" and type(gauge.labels("a")).__name__ == "_GaugeBatch"
    assert isinstance(histogram.labels("a"), prometheus_client.Histogram), "prometheus-client's own, not batched"
    assert histogram.labels("a") is histogram.labels("a")
    by_name = counter.labels(team="a")
    assert isinstance(by_name, prometheus_client.Counter), "by keyword: prometheus-client's lookup, unbatched"
    by_name.inc(2)
    assert _held(counter, "c_total", {"team": "a"}) == 2, "immediate"


def test_a_counter_adds_up_until_the_flush() -> None:
    flush()
    r = CollectorRegistry()
    metric = Counter("c", "x", ["team"], registry=r)
    child = metric.labels("a")
    child.inc()
    child.inc(2.5)
    child.inc(0)
    assert metric_values._PENDING.count(child) == 1, "one pending entry per child, however many updates"
    assert _held(metric, "c_total", {"team": "a"}) == 0
    flush()
    assert _held(metric, "c_total", {"team": "a"}) == 3.5 and not metric_values._PENDING
    flush()  # nothing pending: nothing pushed twice
    assert _held(metric, "c_total", {"team": "a"}) == 3.5


def test_a_gauge_batches_inc_and_dec_and_sets_at_once() -> None:
    flush()
    r = CollectorRegistry()
    metric = Gauge("g", "x", ["team"], registry=r)
    child = metric.labels("a")
    child.inc(5)
    child.dec(2)
    assert _held(metric, "g", {"team": "a"}) == 0
    flush()
    assert _held(metric, "g", {"team": "a"}) == 3
    child.inc(10)
    child.set(1)  # immediate, and the pending +10 no longer applies
    assert _held(metric, "g", {"team": "a"}) == 1
    flush()
    assert _held(metric, "g", {"team": "a"}) == 1
    child.dec()
    assert r.get_sample_value("g", {"team": "a"}) == 0, "a collection flushes first"


def test_a_local_histogram_refuses_unsorted_buckets_and_a_wrong_label_count() -> None:
    r = CollectorRegistry()
    with pytest.raises(ValueError, match="sorted"):
        LocalHistogram("bad", "x", ["team"], buckets=(2, 1), registry=r)
    h = LocalHistogram("h", "x", ["team", "model"], buckets=(1, 2), registry=r)
    with pytest.raises(ValueError, match="expected labels"):
        h.labels("only-one")
    assert h.labels("a", "m") is h.labels("a", "m")


def test_a_local_histogram_counts_each_value_in_the_first_bucket_it_fits() -> None:
    r = CollectorRegistry()
    h = LocalHistogram("h", "x", ["team"], buckets=(0.5, 1, 2), registry=r)
    assert h.labels("a").counts == [0, 0, 0, 0], "+Inf appended"
    for value in (0.0, 0.5, 0.7, 1.0, 2.0, 2.1, 1e9):
        h.labels("a").observe(value)
    assert h.labels("a").counts == [2, 2, 1, 2], "a bound's own value counts in its bucket (le is inclusive)"
    buckets = {le: r.get_sample_value("h_bucket", {"team": "a", "le": le}) for le in ("0.5", "1.0", "2.0", "+Inf")}
    assert buckets == {"0.5": 2, "1.0": 4, "2.0": 5, "+Inf": 7}, "cumulative in the exposition"
    assert r.get_sample_value("h_count", {"team": "a"}) == 7
    assert r.get_sample_value("h_sum", {"team": "a"}) == pytest.approx(1e9 + 6.3)
    assert r.get_sample_value("h_created", {"team": "a"}) == pytest.approx(h.labels("a").created)
    with_inf = LocalHistogram("i", "x", [], buckets=(1, math.inf), registry=r)
    assert len(with_inf.labels().counts) == 2, "+Inf given: not added twice"


def test_a_local_histogram_keeps_the_last_exemplar_of_each_bucket() -> None:
    r = CollectorRegistry()
    h = LocalHistogram("h", "x", ["team"], buckets=(1, 2), registry=r)
    child = h.labels("a")
    child.observe(0.2, {"trace_id": "aa"})
    child.observe(0.3, {"trace_id": "bb"})
    child.observe(1.5)
    child.observe(5.0, {"trace_id": "cc"})
    (family,) = h.collect()
    exemplars = {s.labels["le"]: (s.exemplar.labels, s.exemplar.value) for s in family.samples if s.exemplar}
    assert exemplars == {"1.0": ({"trace_id": "bb"}, 0.3), "+Inf": ({"trace_id": "cc"}, 5.0)}
    (described,) = h.describe()
    assert (described.name, described.type, described.samples) == ("h", "histogram", [])
