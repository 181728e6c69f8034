"""policies/admission/order.py: fair order of the waiting room (overdue first), placement of a new
seat among the slots that fit, and which idle seats give way. ``FairOrder`` is a mixin of
``SeatedAdmission``: driven here through a real core, its records built by the core's own dispatch."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from policies.admission import SeatedAdmission, SeatParams, Waiter
from policies.routing import RoundRobin, Router
from policies.teams import TeamLimits
from policies.types import BackendView, Dispatch, Outcome, RequestFacts, Slot

_seq = itertools.count()


class _Nowhere(Router):
    """A router with no opinion: admission falls back on the least reserved slot."""

    name = "nowhere"

    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        return None


def _core(*views: BackendView, router: Router | None = None, **params: float | str) -> SeatedAdmission:
    base = {"admit_water": 1.0, "high_water": 1.0, "kv_overbook": 1.0}
    c = SeatedAdmission(
        router or RoundRobin(),
        teams={"low": TeamLimits(priority=0), "high": TeamLimits(priority=1), "bound": TeamLimits(max_wait_s=100.0)},
        params=SeatParams(**{**base, **params}),  # type: ignore[arg-type]
    )
    c.set_backends("m", list(views) or [BackendView("b0", kv_tokens=2000)], 0.0)
    return c


def _waiter(c: SeatedAdmission, team: str = "low", need: int = 100, arrived: float = 0.0, prio: int = 0) -> Waiter:
    seq = next(_seq)
    req = RequestFacts(rid=f"w{seq}", model="m", team=team, priority=prio, prompt_tokens=need, max_output_tokens=1)
    c.team(team, arrived)
    return Waiter(req, f"conv{seq}", need, arrived, seq, False)


def _sit(c: SeatedAdmission, slot: Slot, tokens: int, team: str = "low", since: float = 0.0) -> str:
    """An idle seat of ``tokens`` on ``slot``, taken at ``since`` by the core's own dispatch."""
    w = _waiter(c, team, tokens, since)
    c._dispatch(w, slot, since, "test")
    c.finish(w.req.rid, Outcome(), since)
    return w.key


def test_order_is_band_then_counter_then_arrival() -> None:
    c = _core()
    late_high = _waiter(c, "high", arrived=5.0)
    boosted = _waiter(c, "low", arrived=9.0, prio=2)  # the request's own priority adds to its team's
    early_low = _waiter(c, "low", arrived=1.0)
    later_low = _waiter(c, "low", arrived=2.0)
    assert c._order([later_low, early_low, late_high, boosted]) == [boosted, late_high, early_low, later_low]
    c.teams["low"].vtc = 10.0
    served_less = _waiter(c, "other", arrived=3.0)
    assert c._order([early_low, served_less]) == [served_less, early_low]  # the counter before arrival


def test_overdue_waiters_go_first_oldest_first() -> None:
    c = _core(wait_lead_s=42.0)
    assert c._deadline(_waiter(c, "bound")) == 58.0 and c._last_call(_waiter(c, "bound")) == 79.0
    old = _waiter(c, "bound", arrived=0.0)
    older = _waiter(c, "bound", arrived=-1.0)
    high = _waiter(c, "high", arrived=50.0)
    assert c._order_now([old, high, older], 57.5) == [older, high, old]  # only `older` has waited 58 s
    assert c._order_now([old, high, older], 58.0) == [older, old, high]  # both overdue: before the band


def test_a_bound_shorter_than_the_lead_is_due_at_once_and_patience_is_capped_by_it() -> None:
    c = _core(wait_lead_s=42.0, quantum_s=100.0)
    c.set_team("short", TeamLimits(max_wait_s=10.0))
    w = _waiter(c, "short")
    assert c._deadline(w) == 0.0 and c._last_call(w) == 0.0 and c._overdue(w, 0.0)
    assert c._patience(_waiter(c, "bound"), ("b0", None), 1000) == 58.0
    assert c._patience(_waiter(c, "low"), ("b0", None), 1000) == 100.0  # the default bound, 300 s, is further


def test_take_removes_a_waiter_from_the_room_and_its_team() -> None:
    c = _core()
    _sit(c, ("b0", None), 2000)
    c.arrive(RequestFacts(rid="r", model="m", team="low", prompt_tokens=500), 0.0)  # no room now: waits
    assert "r" in c.waiting and c.teams["low"].waiting == 1
    c._take(c.waiting["r"])
    assert c.waiting == {} and c.teams["low"].waiting == 0


def test_placement_avoids_the_blocked_heads_slot_and_slots_that_can_never_hold_the_prompt() -> None:
    c = _core(BackendView("small", kv_tokens=1000), BackendView("big", kv_tokens=10_000))
    w = _waiter(c, need=500)
    assert c._place(w, 0.0, avoid=("small", None)).slot == ("big", None)  # type: ignore[union-attr]
    assert c._place(w, 0.0, avoid=("big", None)).slot == ("small", None)  # type: ignore[union-attr]
    large = _waiter(c, need=5000)
    assert c._place(large, 0.0).slot == ("big", None)  # type: ignore[union-attr]
    assert c._place(large, 0.0, avoid=("big", None)) is None


def test_the_blocked_head_waits_for_the_slot_where_it_is_shortest_of_room() -> None:
    c = _core(BackendView("b0", kv_tokens=2000), BackendView("b1", kv_tokens=2000))
    _sit(c, ("b0", None), 1500)
    _sit(c, ("b1", None), 1800)
    assert c._head_slot(_waiter(c, need=1000)) == ("b0", None)


def test_without_the_routers_choice_the_least_reserved_slot_is_taken() -> None:
    c = _core(BackendView("b0", kv_tokens=5000), BackendView("b1", kv_tokens=5000), router=_Nowhere())
    _sit(c, ("b0", None), 1000)
    place = c._place(_waiter(c), 0.0)
    assert place is not None and (place.slot, place.reason) == (("b1", None), "least_wait")


def test_the_routers_backend_on_its_least_reserved_rank_when_it_names_none() -> None:
    c = _core(BackendView("dp", kv_tokens=5000, dp_size=2))  # direct round-robin names no rank
    _sit(c, ("dp", 0), 1000)
    place = c._place(_waiter(c), 0.0)
    assert place is not None and place.slot == ("dp", 1) and place.reason == "least_wait"


def test_an_overdue_waiter_goes_past_the_budget_where_its_prompt_can_ever_fit() -> None:
    c = _core(BackendView("small", kv_tokens=1000), BackendView("big", kv_tokens=6000))
    _sit(c, ("big", None), 6000)  # full
    w = _waiter(c, need=5000)
    assert c._place(w, 0.0) is None
    place = c._overbook(w, 100.0)
    assert place is not None and (place.slot, place.reason) == (("big", None), "overdue")


def test_victims_are_the_fewest_seats_on_any_slot() -> None:
    c = _core(BackendView("b0", kv_tokens=2000), BackendView("b1", kv_tokens=2000), quantum_s=50.0, min_hold_s=20.0)
    _sit(c, ("b0", None), 1000)
    _sit(c, ("b0", None), 1000)
    one = _sit(c, ("b1", None), 2000)
    victims = c._victims(_waiter(c, need=1500, arrived=0.0), 100.0)  # waited past the quantum
    assert victims is not None and [s.key for s in victims] == [one]


def test_victims_are_the_most_served_teams_then_the_oldest() -> None:
    c = _core(BackendView("b0", kv_tokens=2000), quantum_s=1e9, min_hold_s=20.0)
    light = _sit(c, ("b0", None), 1000, team="low", since=0.0)
    heavy = _sit(c, ("b0", None), 1000, team="heavy", since=10.0)
    c.teams["heavy"].vtc = 1e6
    w = _waiter(c, team="fresh", need=1000, arrived=90.0)  # served less than both owners: favoured
    assert [s.key for s in c._victims(w, 100.0) or []] == [heavy]
    c.teams["heavy"].vtc = c.teams["low"].vtc
    assert [s.key for s in c._victims(w, 100.0) or []] == [light]


def test_busy_young_or_queued_seats_never_give_way() -> None:
    c = _core(BackendView("b0", kv_tokens=2000), quantum_s=50.0, min_hold_s=20.0)
    young = _sit(c, ("b0", None), 2000, since=95.0)
    w = _waiter(c, need=1000, arrived=0.0)
    assert c._victims(w, 100.0) is None  # held 5 s < min_hold_s
    assert [s.key for s in c._victims(w, 200.0) or []] == [young]
    c.seats[young].busy = 1
    assert c._victims(w, 200.0) is None  # its turn is running
    c.seats[young].busy = 0
    grown = RequestFacts(
        rid="next", model="m", team="low", conversation=young, prompt_tokens=1900, max_output_tokens=1000
    )
    c.arrive(grown, 200.0)
    assert "next" in c.waiting and c._victims(w, 200.0) is None  # its next turn already waits
