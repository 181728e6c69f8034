"""The adaptive concurrency limit (``policies/adaptive_limit.py``) against latency models of a backend:
it grows while latency holds, finds and holds a cliff (an engine that starts evicting and recomputing
past some concurrency), never grows on an idle backend, and keeps its floor and ceiling; and admission
gives a seat back when a learned limit falls under the seats a rank holds."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import pytest

from policies.adaptive_limit import GradientLimit, normalised
from policies.admission import SeatedAdmission
from policies.routing import RoundRobin
from policies.types import BackendView, Decision, Dispatch, Outcome, RequestFacts


def _run(latency: Callable[[int], float], limit: GradientLimit, n: int = 3000, busy: bool = True) -> list[float]:
    """A backend always offered more work than the limit lets through (``busy``), else one request."""
    seen = []
    for i in range(n):
        inflight = int(limit.limit) if busy else 1
        limit.observe(latency(inflight), inflight, float(i))
        seen.append(limit.limit)
    return seen[-1000:]


def test_steady_latency_lets_the_limit_grow_to_its_ceiling() -> None:
    rng = random.Random(1)
    tail = _run(lambda c: 0.5 * rng.lognormvariate(0, 0.5), GradientLimit(ceiling=128))
    assert min(tail) > 100 and max(tail) == 128


def test_a_latency_cliff_is_found_and_held() -> None:
    rng = random.Random(2)
    knee = 16

    def cliff(c: int) -> float:  # past the knee every turn is recomputed: twenty times slower
        return (0.5 if c <= knee else 10.0) * rng.lognormvariate(0, 0.5)

    tail = _run(cliff, GradientLimit())
    assert 0.6 * knee <= statistics.mean(tail) <= 1.3 * knee
    assert max(tail) < 2 * knee


def test_an_idle_backend_says_nothing_about_its_ceiling() -> None:
    tail = _run(lambda c: 0.5, GradientLimit(initial=8), busy=False)
    assert max(tail) == 8


def test_a_cliff_just_above_the_floor_keeps_the_limit_near_it() -> None:
    tail = _run(lambda c: 0.5 if c <= 3 else 20.0, GradientLimit(initial=2, floor=2))
    assert statistics.mean(tail) < 5 and max(tail) < 6  # it probes past the cliff (at 3) and comes back


def test_started_above_its_cliff_the_limit_has_no_baseline_to_see_it() -> None:
    # The limiter knows no "too slow" but the backend's own past: begin at or below the expected knee.
    tail = _run(lambda c: 0.5 if c <= 3 else 20.0, GradientLimit(initial=8, ceiling=64))
    assert min(tail) == 64


def test_normalised_latency_discounts_uncached_prompt_tokens() -> None:
    assert normalised(2.0, 8192, 0) == pytest.approx(1.0)
    assert normalised(2.0, 150_000, 149_000, norm_tokens=1000) == pytest.approx(1.0)
    assert normalised(2.0, 100, 200) == 2.0  # more cached than sent (a rounding upstream): no discount


def test_bad_parameters_and_samples() -> None:
    with pytest.raises(ValueError):
        GradientLimit(initial=1, floor=2)
    limit = GradientLimit()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert limit.observe(bad, 8, 0.0) == 8
    assert limit.seats() == 8


def test_a_seated_conversation_gives_up_its_seat_when_its_ranks_learned_limit_falls() -> None:
    core = SeatedAdmission(RoundRobin())
    core.set_backends("kimi", [BackendView("hosted", max_running_requests=4)], 0.0)

    def turn(i: int, n: int, now: float) -> list[Decision]:
        return core.arrive(RequestFacts(f"c{i}-{n}", "kimi", prompt_tokens=1000, conversation=f"c{i}"), now)

    first = [d for i in range(4) for d in turn(i, 0, 0.0)]
    assert sum(isinstance(d, Dispatch) for d in first) == 4  # seats under ceil(1.2 × 4)
    for i in range(4):
        core.finish(f"c{i}-0", Outcome(ok=True, prompt_tokens=1000, completion_tokens=10), 1.0)
    core.set_backends("kimi", [BackendView("hosted", max_running_requests=2)], 2.0)  # the limit fell
    second = [d for i in range(4) for d in turn(i, 1, 3.0)]
    # ceil(1.2 × 2) = 3 seats: one conversation gives its seat up and waits as a new one.
    assert sum(isinstance(d, Dispatch) for d in second) == 3
    assert core.snapshot()["waiting"] == 1
