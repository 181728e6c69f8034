"""What the generated traces share: Mooncake-format rows, block ids, sessions, arrival processes.

A generated workload is a ``TraceWorkload`` whose rows come from a seeded generator instead of a
file: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` (one id per 512-token
block, equal ids = equal prefix blocks), so it replays exactly like ``trace:PATH`` and can be written
out as a file (``python -m loadtest.workloads write NAME``). Like the public trace, a turn's prompt
carries the conversation's earlier prompt blocks and the earlier answers as new blocks, and a
partial last block gets a fresh id (its content changes when the conversation grows).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.workloads.core import TRACE_BLOCK_TOKENS, TraceWorkload

Row = dict[str, object]


class Ids:
    """Fresh block ids, and fixed runs of ids for shared prefixes (a system prompt, a document)."""

    def __init__(self) -> None:
        self._next = 0
        self._shared: dict[str, list[int]] = {}

    def fresh(self, n: int = 1) -> list[int]:
        start = self._next
        self._next += n
        return list(range(start, start + n))

    def shared(self, name: str, tokens: int) -> list[int]:
        """The ids of prefix ``name`` (whole blocks: ``tokens`` rounded up to 512)."""
        ids = self._shared.get(name)
        if ids is None:
            ids = self._shared[name] = self.fresh(max(1, math.ceil(tokens / TRACE_BLOCK_TOKENS)))
        return ids


@dataclass(slots=True)
class History:
    """A conversation's prompt as blocks: whole blocks keep their ids, the partial tail is re-issued."""

    ids: Ids
    full: list[int] = field(default_factory=list)
    tail: int = 0
    """Tokens in the partial last block (0..511)."""

    def add(self, tokens: int) -> None:
        total = self.tail + max(0, tokens)
        self.full += self.ids.fresh(total // TRACE_BLOCK_TOKENS)
        self.tail = total % TRACE_BLOCK_TOKENS

    def row(self, t_ms: float, output: int, prefix: list[int] | None = None) -> Row:
        """A request of this history after ``prefix`` (shared blocks), answering ``output`` tokens."""
        head = list(prefix or [])
        ids = head + self.full + (self.ids.fresh() if self.tail else [])
        tokens = TRACE_BLOCK_TOKENS * (len(head) + len(self.full)) + self.tail
        return {"timestamp": round(t_ms), "input_length": tokens, "output_length": max(1, output), "hash_ids": ids}

    @property
    def tokens(self) -> int:
        return TRACE_BLOCK_TOKENS * len(self.full) + self.tail


def poisson(rng: random.Random, rate_per_s: float, horizon_s: float, start_s: float = 0.0) -> Iterator[float]:
    """Arrival times of a Poisson process of ``rate_per_s`` over ``[start_s, horizon_s)``."""
    t = start_s
    while True:
        t += rng.expovariate(rate_per_s)
        if t >= horizon_s:
            return
        yield t


def on_off(
    rng: random.Random, rate_on: float, on_s: tuple[float, float], off_s: tuple[float, float], horizon_s: float
) -> Iterator[float]:
    """Poisson arrivals at ``rate_on`` during ``on`` periods, none during ``off`` ones (both drawn
    uniformly from their ranges): the on/off (interrupted Poisson) model of bursty traffic."""
    t = 0.0
    while t < horizon_s:
        end = min(horizon_s, t + rng.uniform(*on_s))
        yield from poisson(rng, rate_on, end, t)
        t = end + rng.uniform(*off_s)


def lognormal(rng: random.Random, median: float, sigma: float, lo: float, hi: float) -> int:
    return round(min(hi, max(lo, rng.lognormvariate(math.log(median), sigma))))


def log_uniform(rng: random.Random, lo: float, hi: float) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


Generator = Callable[[random.Random, float], list[Row]]
"""(rng, horizon in trace seconds) -> rows, any order (``GeneratedTrace`` sorts them)."""


@dataclass
class GeneratedTrace(TraceWorkload):
    """A Mooncake-format trace from a seeded generator (replayed like ``trace:PATH``)."""

    generator: Generator | None = None
    default_horizon_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.speedup <= 0:
            raise ValueError("--speedup must be positive")
        self.path = Path(f"<{self.name}>")

    def rows(self, horizon_s: float | None = None) -> Iterator[dict]:
        assert self.generator is not None
        rng = random.Random(f"{self.name}/{self.seed}")
        rows = self.generator(rng, horizon_s if horizon_s is not None else self.default_horizon_s)
        rows.sort(key=lambda r: r["timestamp"])  # type: ignore[arg-type,return-value]  # stable: ties keep generation order
        yield from rows


@dataclass(frozen=True, slots=True)
class Member:
    """One workload of the family: its generator, whether routing defaults were tuned on it, and the
    published statistic it reproduces (``docs/benchmarks.md`` lists them)."""

    name: str
    generator: Generator
    tuning: bool
    source: str

    def make(self, *, seed: int = 1, scale: float = 1.0, speedup: float = 1.0) -> GeneratedTrace:
        return GeneratedTrace(
            Path(f"<{self.name}>"), speedup=speedup, scale=scale, seed=seed, name=self.name, generator=self.generator
        )
