"""Lending (``lend_free``): a waiter kept from a seat by the running cap borrows a free running slot
for one turn, at most ``lend_max`` per rank, and gives it back when the turn ends."""

from __future__ import annotations

import itertools

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.types import BackendView, Dispatch, Outcome, RequestFacts

_ids = itertools.count()
DONE = Outcome(prompt_tokens=900, completion_tokens=100)


def turn(conv: str) -> RequestFacts:
    return RequestFacts(f"r{next(_ids)}", "m", prompt_tokens=900, max_output_tokens=100, conversation=conv)


def sent(decisions: list) -> list[Dispatch]:
    return [d for d in decisions if isinstance(d, Dispatch)]


def seated(params: SeatParams) -> tuple[SeatedAdmission, dict[str, str]]:
    """One rank running at most 2 requests with 2 seats, both taken; returns the core and conv -> rid."""
    c = SeatedAdmission(RoundRobin(), params=params)
    c.set_backends("m", [BackendView("b0", kv_tokens=10**9, max_running_requests=2)], 0.0)
    rids = {}
    for conv in ("c0", "c1"):
        r = turn(conv)
        assert len(sent(c.arrive(r, 0.0))) == 1
        rids[conv] = r.rid
    return c, rids


def two_seats(lend_free: int) -> tuple[SeatedAdmission, dict[str, str]]:
    return seated(SeatParams(running_overbook=1.0, lend_free=lend_free))


def test_without_lending_a_waiter_waits_for_a_seat_while_a_running_slot_is_free() -> None:
    c, rids = two_seats(lend_free=0)
    assert sent(c.arrive(turn("c2"), 0.0)) == []
    assert sent(c.finish(rids["c0"], DONE, 1.0)) == []  # c0 thinks: its seat stays, its slot is idle
    assert len(c.waiting) == 1


def test_a_free_running_slot_is_lent_for_one_turn_at_most_lend_max_per_rank() -> None:
    c, rids = two_seats(lend_free=1)
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []  # both running slots busy: nothing to lend
    lent = sent(c.finish(rids["c0"], DONE, 1.0))
    assert [(d.rid, d.reason) for d in lent] == [(c2.rid, "lent")]
    c3 = turn("c3")
    assert sent(c.arrive(c3, 1.0)) == []  # running 2 of 2 again
    assert sent(c.finish(rids["c1"], DONE, 2.0)) == []  # a slot is free, but one lent turn already runs
    again = sent(c.finish(c2.rid, DONE, 3.0))
    assert "c2" not in c.seats  # the lent seat went with its turn; the two seated conversations keep theirs
    assert {"c0", "c1"} <= set(c.seats)
    assert [(d.rid, d.reason) for d in again] == [(c3.rid, "lent")]


def full_rank(rotate_by: str) -> tuple[SeatedAdmission, dict[str, str]]:
    """As ``two_seats`` with lending off and a 100 s quantum rotating by ``rotate_by`` (``cap_patience_s`` past it,
    so that the quantum alone decides here; tests/policies/test_admission_bound.py has the patience)."""
    return seated(
        SeatParams(
            running_overbook=1.0,
            quantum_s=100.0,
            min_hold_s=1.0,
            rotate_by=rotate_by,
            cap_patience_s=1000.0,
            cap_queue_s=1000.0,
        )
    )


def test_rotate_by_lend_serves_a_waiter_past_the_quantum_on_a_free_slot_and_evicts_no_seat() -> None:
    c, rids = full_rank("lend")
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []
    assert sent(c.finish(rids["c0"], DONE, 99.0)) == []  # a free slot, but c2 has waited 99 s of 100
    lent = sent(c.tick(101.0))
    assert [(d.rid, d.reason) for d in lent] == [(c2.rid, "lent")]
    assert {"c0", "c1"} <= set(c.seats)  # nobody lost a seat
    sent(c.finish(c2.rid, DONE, 102.0))
    assert "c2" not in c.seats  # the lent seat goes with its turn


def test_rotate_by_evict_gives_a_waiter_past_the_quantum_an_idle_seat() -> None:
    c, rids = full_rank("evict")
    c2 = turn("c2")
    assert sent(c.arrive(c2, 0.0)) == []
    assert sent(c.finish(rids["c0"], DONE, 99.0)) == []
    placed = sent(c.tick(101.0))
    assert [(d.rid, d.reason) for d in placed] == [(c2.rid, "least_wait")]
    assert "c2" in c.seats and "c0" not in c.seats  # c0's idle seat was given up
