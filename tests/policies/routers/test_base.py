"""policies/routers/base.py: slots (backend, DP rank), decisions for a slot, process-stable hashing,
rendezvous order, and the in-flight count the routers keep."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from policies.routers.base import (
    Inflight,
    Rendezvous,
    make_dispatch,
    mix64,
    slot_label,
    slot_of,
    slots_of,
    stable_hash,
)
from policies.types import BackendView, Dispatch

ROOT = Path(__file__).resolve().parents[3]


def test_slots_are_every_rank_in_the_order_given_and_none_without_dp() -> None:
    dp, one, zero = BackendView("dp", dp_size=3), BackendView("one"), BackendView("zero", dp_size=0)
    assert [s for s, _ in slots_of([one, dp, zero])] == [("one", None), ("dp", 0), ("dp", 1), ("dp", 2), ("zero", None)]
    assert all(view is dp for s, view in slots_of([dp]))
    assert slots_of([]) == []


def test_a_dispatch_for_a_slot_and_back() -> None:
    d = make_dispatch("r", ("b", 2), "prefix", {"x": 1.0}, 42)
    assert d == Dispatch("r", "b", 2, "prefix", {"x": 1.0}, 42) and slot_of(d) == ("b", 2)
    plain = make_dispatch("r", ("b", None), "least_wait")
    assert plain.scores == {} and plain.matched_tokens is None and slot_of(plain) == ("b", None)
    assert make_dispatch("r", ("b", None), "x").scores is not plain.scores  # no shared default dict


def test_a_slot_without_dp_is_labelled_as_rank_zero() -> None:
    assert slot_label(("b", None)) == "b@0" == slot_label(("b", 0))
    assert slot_label(("b", 3)) == "b@3"


def test_stable_hash_is_blake2b_and_the_same_in_another_process() -> None:
    expected = int.from_bytes(hashlib.blake2b(b"conv-1", digest_size=8).digest(), "little")
    assert stable_hash("conv-1") == expected
    other = subprocess.run(
        [sys.executable, "-c", "from policies.routers.base import stable_hash; print(stable_hash('conv-1'))"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=ROOT,
    )
    assert int(other.stdout) == expected


def test_mix64_is_splitmix64s_finaliser() -> None:
    # SplitMix64 from state 0: its first outputs are well-known test vectors
    assert mix64(0) == 0xE220A8397B1DCDAF
    assert mix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4
    assert all(0 <= mix64(x) < 2**64 for x in (1, 2**63, 2**64 - 1))
    assert len({mix64(x) for x in range(1000)}) == 1000


def test_rendezvous_order_is_stable_and_moves_only_the_removed_slot() -> None:
    slots = [(f"b{i}", None) for i in range(5)]
    r = Rendezvous()
    order = r.order(12345, slots)
    assert sorted(order) == sorted(slots)
    assert Rendezvous().order(12345, list(reversed(slots))) == order  # input order does not matter
    gone = order[0]
    assert r.order(12345, [s for s in slots if s != gone]) == order[1:]  # the others keep their order


def test_rendezvous_spreads_keys_over_slots() -> None:
    slots = [(f"b{i}", r) for i in range(2) for r in range(4)]
    r = Rendezvous()
    firsts = [r.order(mix64(k), slots)[0] for k in range(4000)]
    counts = {s: firsts.count(s) for s in slots}
    assert min(counts.values()) > 400 and max(counts.values()) < 600  # 500 each, give or take


def test_inflight_counts_per_slot_and_backend() -> None:
    f = Inflight()
    f.add("a", ("b0", 0))
    f.add("b", ("b0", 1))
    f.add("c", ("b1", None))
    assert (f.count(("b0", 0)), f.count(("b0", 1)), f.count(("b1", None)), f.count(("b9", None))) == (1, 1, 1, 0)
    assert f.per_backend == {"b0": 2, "b1": 1}
    f.add("a", ("b1", None))  # dispatched again: it counts where it went last
    assert f.count(("b0", 0)) == 0 and f.count(("b1", None)) == 2 and f.per_backend == {"b0": 1, "b1": 2}
    assert f.remove("a") == ("b1", None) and f.remove("a") is None
    assert f.per_backend == {"b0": 1, "b1": 1} and f.slot_of == {"b": ("b0", 1), "c": ("b1", None)}
