"""policies/admission/sizing.py: what a seat needs, each slot's seat budget over every tier (GPU pool,
host tier, running cap), the swap quantum, and what a released seat gives back. ``SeatSizing`` is a
mixin of ``SeatedAdmission``: driven here through a real core."""

from __future__ import annotations

import dataclasses
import math

import pytest

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts


def _core(*views: BackendView, **params: float | bool | str) -> SeatedAdmission:
    c = SeatedAdmission(RoundRobin(), params=SeatParams(**params))  # type: ignore[arg-type]
    c.set_backends("m", list(views), 0.0)
    return c


def _req(rid: str, tokens: int, out: int = 0, conv: str | None = None, fp: Fingerprint = ()) -> RequestFacts:
    return RequestFacts(
        rid=rid, model="m", prompt_tokens=tokens, max_output_tokens=out, conversation=conv, fingerprint=fp
    )


def _seat(c: SeatedAdmission, rid: str, tokens: int, conv: str, now: float = 0.0, **kw: object) -> Dispatch:
    [d] = c.arrive(_req(rid, tokens, conv=conv, **kw), now)  # type: ignore[arg-type]
    assert isinstance(d, Dispatch)
    return d


def test_a_seat_needs_the_prompt_and_the_expected_output_clipped() -> None:
    c = _core(BackendView("b0"))
    assert c._need(_req("r", 1000)) == 1000 + 1024  # no max_tokens: default_output
    assert c._need(_req("r", 1000, out=50)) == 1050
    assert c._need(_req("r", 1000, out=100_000)) == 1000 + 4096  # SGLang's own clip
    assert _core(BackendView("b0"), output_clip=10)._need(_req("r", 1000, out=50)) == 1010


def test_the_host_tier_counts_only_where_the_backend_reloads_from_it() -> None:
    c = _core(BackendView("b0"))
    assert c._tier_capacity(BackendView("x", kv_tokens=1000, host_tokens=500, reload_tokens_per_s=1e5)) == 1500
    assert c._tier_capacity(BackendView("x", kv_tokens=1000, host_tokens=500)) == 1000  # no reload rate
    assert c._tier_capacity(BackendView("x", kv_tokens=0, host_tokens=500, reload_tokens_per_s=1e5)) == 0
    half = _core(BackendView("b0"), host_water=0.5)
    assert half._tier_capacity(BackendView("x", kv_tokens=1000, host_tokens=500, reload_tokens_per_s=1e5)) == 1250


def test_slots_are_the_healthy_ranks_with_their_capacity() -> None:
    c = _core(
        BackendView("dp", kv_tokens=1000, dp_size=2),
        BackendView("one", kv_tokens=500),
        BackendView("sick", kv_tokens=500, healthy=False),
    )
    assert c._slots("m", frozenset()) == [(("dp", 0), 1000), (("dp", 1), 1000), (("one", None), 500)]
    assert c._slots("m", frozenset({"dp"})) == [(("one", None), 500)]
    assert c._slots("other", frozenset()) == []
    assert [c._capacity(s) for s in [("dp", 1), ("dp", 2), ("dp", None), ("one", None), ("one", 0), ("x", None)]] == [
        1000,
        0,  # no such rank
        0,
        500,
        0,
        0,
    ]


def test_the_slot_list_follows_new_views_and_new_parameters() -> None:
    host = BackendView("b0", kv_tokens=1000, host_tokens=1000, reload_tokens_per_s=1e5)
    c = _core(host)
    assert c._slots("m", frozenset()) == [(("b0", None), 2000)]
    c.params = dataclasses.replace(c.params, host_water=0.0)
    assert c._slots("m", frozenset()) == [(("b0", None), 1000)]
    c.set_backends("m", [BackendView("b1", kv_tokens=300)], 1.0)
    assert c._slots("m", frozenset()) == [(("b1", None), 300)]


def test_the_budget_is_the_water_mark_times_the_share() -> None:
    c = _core(BackendView("b0"), admit_water=0.8, high_water=0.9)
    assert c._budget(1000) == pytest.approx(800) and c._budget(1000, growth=True) == pytest.approx(900)
    assert c._budget(0) == math.inf  # unknown capacity: unbounded
    c.set_share(0.5, False, 0.0)
    assert c._budget(1000) == pytest.approx(400)
    c._kv_factor = 1.1  # the whole demand fits kv_overbook × the pool: one mark for both
    assert c._budget(1000) == c._budget(1000, growth=True) == pytest.approx(550)


def test_a_conversation_larger_than_the_budget_gets_an_empty_slot() -> None:
    c = _core(BackendView("b0", kv_tokens=1000), admit_water=1.0, kv_overbook=1.0)
    assert c._fits(5000, ("b0", None), 1000)
    c.reserved[("b0", None)] = 1
    assert not c._fits(5000, ("b0", None), 1000) and c._fits(999, ("b0", None), 1000)


def test_the_running_cap_is_a_seat_limit_and_a_lending_bound() -> None:
    c = _core(BackendView("b0", kv_tokens=10**6, max_running_requests=5), BackendView("b1"))
    assert c._seat_limit(("b0", None)) == 6  # ceil(1.2 × 5)
    assert c._running_cap(("b0", None)) == 5
    assert c._seat_limit(("b1", None)) == math.inf and c._running_cap(("b1", None)) == 0
    c.set_share(0.5, False, 0.0)
    assert c._seat_limit(("b0", None)) == 3 and c._running_cap(("b0", None)) == 2
    c.seat_counts[("b0", None)] = 2
    assert c._fits(1, ("b0", None), 10**6)
    c.seat_counts[("b0", None)] = 3  # the KV has room, the running cap has not
    assert not c._fits(1, ("b0", None), 10**6)


def test_the_quantum_is_the_swap_cost_over_the_overhead_clipped() -> None:
    c = _core(
        BackendView("plain", kv_tokens=10**6),
        BackendView("host", kv_tokens=10**6, host_tokens=10**6, reload_tokens_per_s=1_000_000),
        quantum_s=900.0,
        min_hold_s=20.0,
        swap_overhead=0.01,
    )
    assert c._quantum(("plain", None), 150_000) == 900.0
    assert c._quantum(("host", None), 500_000) == pytest.approx(50.0)  # 0.5 s reload / 1 %
    assert c._quantum(("host", None), 1_000) == 20.0  # never under min_hold_s
    assert c._quantum(("host", None), 100_000_000) == 900.0  # never over quantum_s


def test_a_learned_limit_stands_for_the_kv_only_without_a_reported_pool() -> None:
    c = _core(
        BackendView("learned", max_running_requests=4), BackendView("sized", kv_tokens=1000, max_running_requests=4)
    )
    assert c._limit_stands_for_kv(("learned", None))
    assert not c._limit_stands_for_kv(("sized", None)) and not c._limit_stands_for_kv(("gone", None))


def test_releasing_a_seat_gives_back_its_tokens_its_count_and_its_anchor() -> None:
    c = _core(BackendView("b0", kv_tokens=100_000))
    fp = tuple((k, 100) for k in range(1, 11))
    _seat(c, "r1", 1000, conv=None, fp=fp)  # type: ignore[arg-type]
    [(key, seat)] = c.seats.items()
    assert c.anchors == {fp[-2][0]: key} and c.reserved[("b0", None)] == 1000 + 1024
    c._release(seat)
    assert c.seats == {} and c.seat_counts[("b0", None)] == 0 and c.reserved[("b0", None)] == 0
    assert c.anchors == {}
    c._release(seat)  # a seat already given up: nothing more is counted off its slot's seats
    assert c.seat_counts[("b0", None)] == 0


def test_with_shared_blocks_a_release_frees_only_what_no_other_seat_holds() -> None:
    c = _core(BackendView("b0", kv_tokens=100_000), shared_blocks=True)
    prefix = tuple((k, 100) for k in range(1, 11))
    _seat(c, "a", 1100, conv="a", fp=(*prefix, (101, 100)))
    _seat(c, "b", 1100, conv="b", fp=(*prefix, (201, 100)))
    assert c.reserved[("b0", None)] == 2 * (1100 + 1024) - 1000  # the prefix reserved once
    c.finish("a", Outcome(), 1.0)
    c._release(c.seats["a"])
    assert c.reserved[("b0", None)] == 1100 + 1024  # b's whole reservation stays


def test_a_seat_over_a_fallen_limit_is_over_it_and_a_lent_one_never() -> None:
    c = _core(BackendView("b0", kv_tokens=10**6, max_running_requests=3))
    for i in range(3):
        _seat(c, f"r{i}", 100, conv=f"c{i}")
    c.set_backends("m", [BackendView("b0", kv_tokens=10**6, max_running_requests=1)], 1.0)  # limit now 2
    assert c._over_limit(c.seats["c0"])
    c.seats["c0"].one_shot = True
    assert not c._over_limit(c.seats["c0"])  # lent seats never count: 2 owned ≤ 2
    assert not c._over_limit(c.seats["c1"])


def test_a_full_rank_with_waiters_releases_idle_seats_sooner() -> None:
    c = _core(BackendView("b0", kv_tokens=10**6, max_running_requests=1), idle_release_s=30.0)
    _seat(c, "r0", 100, conv="c0")
    _seat(c, "r1", 100, conv="c1")  # the rank's seat limit: ceil(1.2 × 1) = 2
    seat = c.seats["c0"]
    assert c._idle_release_s(seat) == 30.0  # full, but nobody waits
    assert c.arrive(_req("w", 100, conv="c2"), 0.0) == []
    assert c._idle_release_s(seat) == 10.0  # full_idle_release_s
    c.cancel("w", 0.1)
    assert c._idle_release_s(seat) == 30.0


def test_the_kv_factor_is_overbook_while_the_whole_demand_fits_it() -> None:
    c = _core(BackendView("b0", kv_tokens=10_000), admit_water=0.85, kv_overbook=1.1, full_idle_release_s=10.0)
    _seat(c, "a", 9000, conv="a")  # 9,000 + 1,024 > 0.85 × 10,000, but within 1.1 × 10,000
    assert c._kv_factor == 1.1
    c.arrive(_req("b", 5000, conv="b"), 0.5)  # a new conversation: counted at once, 15,048 > 11,000
    assert c._kv_factor == 1.0 and "b" in c.waiting
    c.cancel("b", 0.6)
    c._set_kv_factor(0.9)  # less than a second since the last count: kept
    assert c._kv_factor == 1.0
    c.finish("a", Outcome(), 1.0)
    c._set_kv_factor(12.0)  # b went unserved past full_idle_release_s: no longer demand
    assert c._kv_factor == 1.1


def test_unknown_capacity_is_never_overbooked() -> None:
    c = _core(BackendView("b0"), kv_overbook=1.1)
    _seat(c, "a", 100, conv="a")
    assert c._kv_factor == 1.0
