"""policies/routers/estimators.py: the prefill time model, the blocks many conversations share, each
slot's recent working set, and a counter's recent maximum (``min-ttft``'s estimators)."""

from __future__ import annotations

import pytest

from policies.routers.base import mix64, stable_hash
from policies.routers.estimators import CommonBlocks, Footprint, PrefillModel, RecentMax, SlotState
from policies.types import Fingerprint


def chain(label: str, n: int, parent: Fingerprint = (), tokens: int = 100) -> Fingerprint:
    out = list(parent)
    for i in range(n):
        prev = out[-1][0] if out else 0
        out.append((mix64(prev ^ stable_hash(f"{label}#{i}")), tokens))
    return tuple(out)


SYSTEM = chain("system", 2)


# -- PrefillModel ----------------------------------------------------------------------------------


def test_prefill_model_matches_its_documented_prior() -> None:
    m = PrefillModel()
    assert m.seconds(160_000, 0) == pytest.approx(12.03)  # a 160k-token recompute ≈ 12 s
    assert m.seconds(3_000, 150_000) == pytest.approx(0.03 + 3_000 / 40_000 + 6.25e-10 * 3_000 * 151_500)
    assert 0.35 < m.seconds(3_000, 150_000) < 0.45  # a 3k-token turn ≈ 0.4 s


def test_prefill_costs_grow_with_the_context_and_nothing_uncached_costs_the_pass() -> None:
    m = PrefillModel(t0=0.05, rate=10_000.0, k_attn=1e-9)
    assert m.seconds(0, 100_000) == 0.05 and m.seconds(-500, 0) == 0.05
    assert m.seconds(1000, 0) == pytest.approx(0.05 + 0.1 + 1e-9 * 1000 * 500)
    assert m.seconds(1000, 50_000) > m.seconds(1000, 0)


# -- CommonBlocks ----------------------------------------------------------------------------------


def test_nothing_is_common_to_a_fresh_estimator() -> None:
    assert CommonBlocks().prefix_blocks(chain("a", 5, SYSTEM)) == 0
    assert CommonBlocks().prefix_blocks(()) == 0


def test_a_branch_point_seen_in_enough_requests_is_common() -> None:
    c = CommonBlocks(window=8, frac=0.25)
    c.observe(chain("a", 3, SYSTEM))
    c.observe(chain("b", 3, SYSTEM))
    assert c.prefix_blocks(chain("c", 3, SYSTEM)) == len(SYSTEM)


def test_a_common_prefix_stops_being_common_once_it_is_rare_in_the_window() -> None:
    c = CommonBlocks(window=8, frac=0.25)
    c.observe(chain("a", 3, SYSTEM))
    c.observe(chain("b", 3, SYSTEM))
    probe = chain("c", 3, SYSTEM)
    assert c.prefix_blocks(probe) == len(SYSTEM)
    for i in range(7):  # unrelated requests push the first out of the window: 1 of 8 < 25 %
        c.observe(chain(f"other{i}", 3))
    assert c.prefix_blocks(probe) == 0


def test_an_answer_is_recomputed_once_observations_change_it() -> None:
    c = CommonBlocks()
    probe = chain("c", 3, SYSTEM)
    assert c.prefix_blocks(probe) == 0
    c.observe(chain("a", 3, SYSTEM))
    c.observe(chain("b", 3, SYSTEM))
    assert c.prefix_blocks(probe) == len(SYSTEM)  # the same tuple asks again after a change


def test_blocks_past_scan_blocks_are_never_common() -> None:
    deep = chain("deep", 6)  # a shared prefix of six blocks
    c = CommonBlocks(scan_blocks=4)
    c.observe(chain("a", 2, deep))
    c.observe(chain("b", 2, deep))
    assert c.prefix_blocks(chain("c", 2, deep)) == 0  # its branch point is block 6, past the scan
    wide = CommonBlocks(scan_blocks=16)
    wide.observe(chain("a", 2, deep))
    wide.observe(chain("b", 2, deep))
    assert wide.prefix_blocks(chain("c", 2, deep)) == 6


def test_memory_is_bounded_by_max_blocks() -> None:
    c = CommonBlocks(max_blocks=4)
    for i in range(10):
        c.observe(chain(f"p{i}", 5))
    assert len(c._next) <= 4 and len(c._tails) <= 4


def test_a_repeated_prompt_over_a_full_window_keeps_the_counts() -> None:
    c = CommonBlocks(window=4)
    same = chain("same", 3)
    for _ in range(10):
        c.observe(same)
    assert len(c._recent) == 4 and set(c._counts.values()) == {4}


# -- Footprint -------------------------------------------------------------------------------------


def test_footprint_counts_each_conversations_latest_prompt_where_it_was_sent() -> None:
    f = Footprint(active_s=600.0)
    a, b = ("b0", None), ("b1", None)
    f.touch(a, key=1, tokens=1000, now=0.0)
    f.touch(a, key=2, tokens=500, now=1.0)
    f.touch(a, key=1, tokens=1500, now=2.0)  # its next turn: the latest size counts
    assert f.tokens(a, 2.0) == 2000 and f.own(1) == (a, 1500)
    f.touch(b, key=1, tokens=1600, now=3.0)  # it moved: it leaves the old slot's set
    assert f.tokens(a, 3.0) == 500 and f.tokens(b, 3.0) == 1600 and f.own(1) == (b, 1600)
    assert f.tokens(("b9", None), 3.0) == 0 and f.own(99) is None


def test_footprint_forgets_conversations_idle_past_active_s() -> None:
    f = Footprint(active_s=10.0)
    s = ("b0", 0)
    f.touch(s, key=1, tokens=100, now=0.0)
    f.touch(s, key=2, tokens=200, now=5.0)
    assert f.tokens(s, 10.0) == 300  # exactly active_s: still counted
    assert f.tokens(s, 10.5) == 200 and f.own(1) is None
    f.touch(s, key=2, tokens=250, now=6.0)  # touched again: the newest entry
    assert f.tokens(s, 15.5) == 250 and f.tokens(s, 16.5) == 0


# -- RecentMax -------------------------------------------------------------------------------------


def test_recent_max_is_the_largest_value_within_the_window() -> None:
    r = RecentMax(window_s=2.0)
    assert r.max(0.0) == 0
    r.set(5, 0.0)
    r.set(2, 1.0)
    assert r.value == 2 and r.max(1.5) == 5  # a report taken meanwhile may still count the 5
    assert r.max(2.1) == 2  # the 5 is older than the window
    r.set(1, 3.0)
    r.set(4, 3.5)  # a larger later value replaces the smaller ones before it
    assert r.max(3.6) == 4 and len(r._points) == 1


def test_recent_max_never_falls_below_the_current_value() -> None:
    r = RecentMax(window_s=1.0)
    r.set(3, 0.0)
    assert r.max(100.0) == 3


def test_slot_state_starts_idle() -> None:
    st = SlotState(RecentMax(2.0), RecentMax(2.0))
    assert (st.busy_until, st.pending_s, st.pending, st.inflight) == (0.0, 0.0, set(), 0)
    assert st.pending is not SlotState(RecentMax(2.0), RecentMax(2.0)).pending
