"""Adaptive concurrency limit of one backend from observed latency alone (gradient style): for an
endpoint that publishes no capacity or load (``engine: openai``), how many requests it may run at once.
A pure object, time passed in; the pool feeds it live, the simulator under ``--visibility blind``.

In the spirit of Envoy's adaptive concurrency filter and the gradient limiters (Netflix's
concurrency-limits ``Gradient2``): latency against the backend's own baseline says whether more
concurrency still buys throughput or only queueing (or, on a KV-bound engine, eviction and recompute).

Per sample (``latency_s``: a request's time to first token over its expected cost, ``normalised()``;
``inflight``: requests on the backend when it was sent):

- ``base``: the ``base_quantile`` (25th percentile) of the last ``long_window`` (500) samples, the
  backend's own baseline; ``short``: the median of the last ``short_window`` (16): the recent latency
  (quantiles, not means: a coding agent's turns vary in cost even normalised, and one stalled turn
  must not move the limit);
- ``gradient = clip(tolerance · base / short, min_gradient, 1)``;
- ``target = limit + √limit`` while latency holds (``gradient = 1``: the queue allowance), else
  ``limit · gradient``; no growth while the backend is not using half its limit (``inflight < limit / 2``:
  an idle backend says nothing about its ceiling);
- ``limit ← clip((1 − smoothing) · limit + smoothing · target, floor, ceiling)``.

The first ``short_window`` samples only fill the windows. ``seats()`` is the integer limit admission
uses as a backend's seat count (``BackendView.max_running_requests``; a rank holding more seats than a
fallen limit gives one up at its next turn: ``policies/admission/sizing.py::_over_limit``).

Parameters and defaults: ``initial=8``, ``floor=2``, ``ceiling=256``, ``short_window=16``,
``long_window=500``, ``base_quantile=0.25``, ``tolerance=2.2``, ``min_gradient=0.5`` (at most halved per
sample, before smoothing), ``smoothing=0.05``; ``normalised``: ``norm_tokens=8192``. The defaults
were chosen on the simulator (``docs/engines.md``: small grids on ``b300-tp8-bf16`` at 16 and 48 conversations
and ``b300-tp8-fp8-hicache`` at 48 and 64, seed 1).
"""

from __future__ import annotations

import math
from collections import deque


def normalised(ttft_s: float, prompt_tokens: int, cached_tokens: int, norm_tokens: int = 8192) -> float:
    """A time to first token over its request's cost, ``ttft / (1 + uncached / norm_tokens)``: a cold
    150k-token prompt is not congestion, the same prompt waiting behind others is."""
    return ttft_s / (1 + max(0, prompt_tokens - cached_tokens) / norm_tokens)


class GradientLimit:
    def __init__(
        self,
        initial: float = 8,
        floor: float = 2,
        ceiling: float = 256,
        short_window: int = 16,
        long_window: int = 500,
        base_quantile: float = 0.25,
        tolerance: float = 2.2,
        min_gradient: float = 0.5,
        smoothing: float = 0.05,
    ) -> None:
        if not 0 < floor <= initial <= ceiling:
            raise ValueError("need 0 < floor <= initial <= ceiling")
        if not 0 < short_window <= long_window:
            raise ValueError("need 0 < short_window <= long_window")
        self.floor, self.ceiling = floor, ceiling
        self.base_quantile, self.tolerance = base_quantile, tolerance
        self.min_gradient, self.smoothing = min_gradient, smoothing
        self.limit = float(initial)
        self.recent: deque[float] = deque(maxlen=short_window)
        self.history: deque[float] = deque(maxlen=long_window)
        self.updated_at = 0.0
        self.samples = 0

    @property
    def short(self) -> float:
        return _quantile(self.recent, 0.5)

    @property
    def base(self) -> float:
        return _quantile(self.history, self.base_quantile)

    def observe(self, latency_s: float, inflight: int, now: float) -> float:
        """One sample; returns the new limit."""
        if latency_s <= 0 or not math.isfinite(latency_s):
            return self.limit
        self.samples += 1
        self.recent.append(latency_s)
        self.history.append(latency_s)
        self.updated_at = now
        if len(self.recent) < (self.recent.maxlen or 1):
            return self.limit
        gradient = min(1.0, max(self.min_gradient, self.tolerance * self.base / self.short))
        target = self.limit + math.sqrt(self.limit) if gradient >= 1.0 else self.limit * gradient
        if inflight < self.limit / 2:
            target = min(target, self.limit)
        limit = (1 - self.smoothing) * self.limit + self.smoothing * target
        self.limit = min(self.ceiling, max(self.floor, limit))
        return self.limit

    def seats(self) -> int:
        """The limit as a whole number of requests."""
        return max(1, int(self.limit))


def _quantile(values: deque[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0
