"""The seated admission core's seats, driven directly with time passed in (no I/O): a conversation
keeps its backend, seats rotate and are released, and every KV tier counts in the budget."""

from __future__ import annotations

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.types import BackendView, Outcome, RequestFacts
from tests.policies.admission_helpers import core, dispatched, req


def test_seated_conversation_keeps_its_backend_and_goes_first() -> None:
    c = core(kv=10_000, backends=2)
    a1 = dispatched(c.arrive(req(conv="A", tokens=4_000), 0.0))[0]
    b1 = dispatched(c.arrive(req(conv="B", tokens=4_000), 0.0))[0]
    fill = [dispatched(c.arrive(req(conv=f"F{i}", tokens=4_900), 0.0)) for i in range(2)]
    assert all(fill)
    waiting = req(conv="W", tokens=4_000)
    assert c.arrive(waiting, 0.1) == []  # no room for a new seat anywhere
    c.finish(a1.rid, Outcome(prompt_tokens=4_000, completion_tokens=100), 1.0)
    a2 = dispatched(c.arrive(req(conv="A", tokens=4_300), 3.0))  # A's next turn goes straight through
    assert a2 and a2[0].backend == a1.backend and a2[0].reason == "prefix"
    assert b1.backend != a1.backend
    for slot, tokens in c.reserved.items():
        assert tokens <= 10_000, slot


def test_waiter_rotation_bounds_the_wait() -> None:
    c = core(kv=5_000, quantum_s=60, idle_release_s=1000, min_hold_s=10)
    a = dispatched(c.arrive(req(conv="A", tokens=4_000), 0.0))[0]
    c.finish(a.rid, Outcome(), 1.0)
    w = req(conv="W", tokens=4_000)
    assert c.arrive(w, 30.0) == []
    assert not dispatched(c.tick(89.0))  # W has waited 59 s
    assert [d.rid for d in dispatched(c.tick(90.5))] == [w.rid]  # 60 s: A's idle seat goes to W
    assert "A" not in c.seats and "W" in c.seats


def test_idle_seat_released_and_quantum_rotation() -> None:
    c = core(kv=5_000, quantum_s=60, idle_release_s=30, min_hold_s=10, rotate_on="seat")
    a = dispatched(c.arrive(req(conv="A", tokens=4_000), 0.0))[0]
    c.finish(a.rid, Outcome(), 1.0)
    w = req(conv="W", tokens=4_000)
    assert c.arrive(w, 2.0) == []
    assert not dispatched(c.tick(20.0))  # A idle but held less than the quantum
    got = dispatched(c.tick(61.0))  # quantum passed: A's idle seat goes to W
    assert [d.rid for d in got] == [w.rid]
    assert "A" not in c.seats and "W" in c.seats
    c.finish(w.rid, Outcome(), 62.0)
    c.tick(100.0)
    assert "W" not in c.seats  # idle past idle_release_s


def test_seated_turn_reports_the_prefix_the_router_knows() -> None:
    from policies.routers import MinTTFT

    c = SeatedAdmission(MinTTFT(), params=SeatParams())
    c.set_backends("m", [BackendView("b0", kv_tokens=1_000_000), BackendView("b1", kv_tokens=1_000_000)], 0.0)
    first = RequestFacts(
        rid="t1",
        model="m",
        prompt_tokens=3000,
        max_output_tokens=10,
        fingerprint=tuple((k, 1000) for k in (11, 12, 13)),
    )
    d1 = dispatched(c.arrive(first, 0.0))[0]
    c.finish("t1", Outcome(prompt_tokens=3000, completion_tokens=10), 1.0)
    second = RequestFacts(
        rid="t2",
        model="m",
        prompt_tokens=4000,
        max_output_tokens=10,
        fingerprint=tuple((k, 1000) for k in (11, 12, 13, 14)),
    )
    d2 = dispatched(c.arrive(second, 2.0))[0]
    assert d2.backend == d1.backend and d2.reason == "prefix"
    assert d2.scores["matched_tokens"] == 3000.0


# ----- every tier ---------------------------------------------------------------------


def test_max_running_requests_is_a_seat_budget() -> None:
    """A rank reporting max_running_requests 5 seats at most ceil(1.2 × 5) = 6 conversations."""
    c = SeatedAdmission(RoundRobin(), params=SeatParams())
    c.set_backends("m", [BackendView("b0", kv_tokens=10**9, max_running_requests=5)], 0.0)
    out = []
    for i in range(8):
        out += dispatched(c.arrive(req(conv=f"c{i}"), 0.0))
    assert len(out) == 6 and len(c.waiting) == 2
    # without the cap the same pool seats all eight
    c2 = SeatedAdmission(RoundRobin(), params=SeatParams())
    c2.set_backends("m", [BackendView("b0", kv_tokens=10**9)], 0.0)
    assert sum(len(dispatched(c2.arrive(req(conv=f"c{i}"), 0.0))) for i in range(8)) == 8


def test_host_tier_counts_in_the_budget_and_a_cheap_swap_rotates_fast() -> None:
    """GPU 10k + host 10k reloaded at 1M tokens/s: two 8k conversations fit; a third waits only
    about min_hold_s (its swap costs 8 ms), not the 900 s recompute quantum."""
    view = BackendView("b0", kv_tokens=10_000, host_tokens=10_000, reload_tokens_per_s=1e6)
    c = SeatedAdmission(RoundRobin(), params=SeatParams(admit_water=1.0, high_water=1.0))
    c.set_backends("m", [view], 0.0)
    a, b, w = req(tokens=7_900, conv="a"), req(tokens=7_900, conv="b"), req(tokens=7_900, conv="w")
    assert len(dispatched(c.arrive(a, 0.0))) == 1 and len(dispatched(c.arrive(b, 0.0))) == 1
    assert dispatched(c.arrive(w, 0.0)) == []
    c.finish(a.rid, Outcome(prompt_tokens=7_900, completion_tokens=100), 1.0)
    c.finish(b.rid, Outcome(prompt_tokens=7_900, completion_tokens=100), 1.0)
    assert dispatched(c.tick(15.0)) == []  # seats held less than min_hold_s
    assert [d.rid for d in dispatched(c.tick(21.0))] == [w.rid]
    # the same pool without a host tier seats one and rotates only after the quantum
    g = SeatedAdmission(RoundRobin(), params=SeatParams(admit_water=1.0, high_water=1.0))
    g.set_backends("m", [BackendView("b0", kv_tokens=10_000)], 0.0)
    x, y = req(tokens=7_900, conv="x"), req(tokens=7_900, conv="y")
    assert len(dispatched(g.arrive(x, 0.0))) == 1 and dispatched(g.arrive(y, 0.0)) == []
    g.finish(x.rid, Outcome(prompt_tokens=7_900, completion_tokens=100), 1.0)
    assert dispatched(g.tick(21.0)) == []
