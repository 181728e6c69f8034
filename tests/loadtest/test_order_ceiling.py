"""The waiting order's ceiling (``loadtest/analysis/order_ceiling.py``): the engine admits its waiting queue in
the order asked for, and everything else stays the engine's own."""

from __future__ import annotations

import pytest

from backends.sim.engine import EngineRequest
from backends.sim.profiles import get_profile
from loadtest.analysis.order_ceiling import OrderedEngine, run
from loadtest.sim.simulate import SimConfig
from tests.backends.sim.test_engine import blocks, by_kind

# A pool that runs one of the waiting requests at a time, so their first tokens come in admission order.
POOL = 25_000
SIZES = {"old-big": 18_000, "small": 10_000, "medium": 15_000}


def _first_tokens(order: str) -> list[str]:
    e = OrderedEngine(get_profile("tiny"), order, kv_tokens=POOL)
    e.submit(EngineRequest("busy", blocks(20_000), 200, 200), 0.0)
    for i, (rid, size) in enumerate(SIZES.items()):
        e.submit(EngineRequest(rid, blocks(size), 1, 1), 0.001 * (i + 1))  # old-big first
    events = e.advance(1e9)
    e.check_invariants()
    firsts = by_kind(events, "first_token")
    assert set(firsts) == {"busy", *SIZES}
    return sorted(SIZES, key=lambda rid: firsts[rid].time)


def test_each_order_admits_the_queue_as_it_says() -> None:
    assert _first_tokens("fcfs") == ["old-big", "small", "medium"]
    assert _first_tokens("sjf") == ["small", "medium", "old-big"]
    # waited 0 s at the first admission: smallest first; with a zero threshold everyone is aged: arrival
    assert _first_tokens("sjf+age:1000") == ["small", "medium", "old-big"]
    assert _first_tokens("sjf+age:0") == ["old-big", "small", "medium"]
    assert _first_tokens("mix:0") == ["small", "medium", "old-big"]


def test_unknown_orders_are_refused() -> None:
    for order in ("sjf+age", "mix", "fcfs:3", "random"):
        with pytest.raises(ValueError, match="unknown order"):
            OrderedEngine(get_profile("tiny"), order)


def test_a_run_reports_its_order_and_an_order_moves_waits_not_work() -> None:
    cfg = SimConfig(profile="b300-tp8-fp8-hicache", conversations=16, minutes=4, warmup_minutes=1)
    fcfs, sjf = run("fcfs", cfg), run("sjf", cfg)
    assert (fcfs["order"], sjf["order"]) == ("fcfs", "sjf")
    assert fcfs["completed_rpm"] > 0 and sjf["completed_rpm"] > 0
    # an order moves who waits, not how much the engine does: the same work within a few percent
    assert sjf["total_tpm"] == pytest.approx(fcfs["total_tpm"], rel=0.1)
