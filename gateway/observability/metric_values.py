"""How one worker keeps its metric values (``gateway/observability/metrics.py`` names them): counter and gauge
updates batched into plain numbers and pushed into prometheus-client's values at :func:`flush`;
one worker's histograms as plain numbers behind prometheus-client's collector interface.

A short request makes about a dozen metric updates; prometheus-client's own (a check of the child,
a lock, for a histogram a walk over the buckets in Python) were a visible share of its instructions
(counted with ``loadtest/bench/instr.py``; a short request's cost now: docs/benchmarks.md, "The short
request"). Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

_PENDING: list[_Batched] = []
"""The children updated since the last :func:`flush` (each once)."""


def flush() -> None:
    """Push every batched update into prometheus-client's values (see :class:`_Batched`). Called before
    every collection and exposition, at a worker's shutdown, and every ``Metrics.FLUSH_S`` in a worker
    of several (its siblings read its files)."""
    global _PENDING
    batch, _PENDING = _PENDING, []
    for item in batch:
        item.flush()


class _Batched:
    """A labelled child's updates as plain additions, pushed into the child at the next :func:`flush`.

    prometheus-client's own update checks the child and takes a lock, on each of a short request's
    counter and gauge updates (``loadtest/bench/instr.py`` counts what that costs; docs/benchmarks.md,
    "The short request"). Here an update is an addition, and the push goes through the child's public
    ``inc``/``set``; a collection or an exposition flushes first, so what is read is current. All
    updates come from the event loop's thread."""

    __slots__ = ("_child", "_delta", "_dirty")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._delta = 0.0
        self._dirty = False

    def _add(self, amount: float = 1) -> None:
        self._delta += amount
        if not self._dirty:
            self._dirty = True
            _PENDING.append(self)

    def flush(self) -> None:
        delta, self._delta, self._dirty = self._delta, 0.0, False
        if delta:
            self._child.inc(delta)


class _CounterBatch(_Batched):
    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._delta += amount  # _add inlined: a call less on every request's counters
        if not self._dirty:
            self._dirty = True
            _PENDING.append(self)


class _GaugeBatch(_Batched):
    """``inc`` and ``dec`` are batched as one delta; ``set`` is immediate and drops the delta."""

    __slots__ = ()

    inc = _Batched._add

    def dec(self, amount: float = 1) -> None:
        self.inc(-amount)

    def set(self, value: float) -> None:
        self._delta = 0.0
        self._child.set(value)


class _CachedLabels:
    """``labels(*values)`` from a dict once a label set has been seen (batched where the metric's
    type allows, :class:`_Batched`): prometheus-client's own lookup (argument checks, ``str()`` of
    each value, a lock) is paid on every call, and a short request makes about a dozen. Children are
    never removed here, so the cache cannot go stale."""

    _cached: dict[tuple[Any, ...], Any]
    _batch: type[_Batched] | None = None

    def labels(self, *values: Any, **kwargs: Any) -> Any:
        if kwargs:
            return super().labels(*values, **kwargs)  # type: ignore[misc]
        try:
            return self._cached[values]
        except AttributeError:
            self._cached = {}
        except KeyError:
            pass
        child = super().labels(*values)  # type: ignore[misc]
        if self._batch is not None:
            child = self._batch(child)
        self._cached[values] = child
        return child

    def collect(self) -> Any:
        flush()
        return super().collect()  # type: ignore[misc]


class Counter(_CachedLabels, prometheus_client.Counter):
    _batch = _CounterBatch


class Gauge(_CachedLabels, prometheus_client.Gauge):
    _batch = _GaugeBatch


class Histogram(_CachedLabels, prometheus_client.Histogram):
    """A worker of several: prometheus-client's own histogram (its values in the shared files)."""


class _LocalHistogramChild:
    """One label set of a :class:`LocalHistogram`: counts per bucket, the sum, the last exemplar
    of each bucket (as prometheus-client's ``observe`` keeps them)."""

    __slots__ = ("_bounds", "counts", "created", "exemplars", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.exemplars: dict[int, Exemplar] = {}
        self.created = time.time()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        i = bisect_left(self._bounds, amount)  # the first bucket with amount <= its bound (+Inf last)
        self.counts[i] += 1
        self.sum += amount
        if exemplar:
            self.exemplars[i] = Exemplar(exemplar, amount, time.time())


class LocalHistogram:
    """A labelled histogram of one process, kept as plain numbers and exposed through
    prometheus-client's collector interface, with the series, labels, exemplars and ``_created``
    samples of its ``Histogram``. Its ``observe`` is a bisection and two additions, where
    prometheus-client's takes two locks and walks the buckets in Python on every observation
    (docs/benchmarks.md, "The short request"); one worker's histograms are these, a worker of several
    keeps :class:`Histogram` (its siblings read its files)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("Buckets not in sorted order")
        self._bounds = bounds if bounds[-1] == math.inf else [*bounds, math.inf]
        self._le = [floatToGoString(b) for b in self._bounds]
        self._children: dict[tuple[Any, ...], _LocalHistogramChild] = {}
        registry.register(self)

    def labels(self, *values: Any) -> _LocalHistogramChild:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
            child = self._children[values] = _LocalHistogramChild(self._bounds)
        return child

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> list[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in self._children.items():
            labels = [str(v) for v in values]
            buckets: list[Any] = []
            total = 0.0
            for i, le in enumerate(self._le):
                total += child.counts[i]
                exemplar = child.exemplars.get(i)
                buckets.append((le, total, exemplar) if exemplar else (le, total))
            family.add_metric(labels, buckets, child.sum)
            family.samples.append(
                Sample(f"{self._name}_created", dict(zip(self._labelnames, labels, strict=True)), child.created)
            )
        return [family]
