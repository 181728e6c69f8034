"""policies/prefill_choice.py: the prefill partner by cached prefix and queue, load bounded."""

from __future__ import annotations

import pytest

from policies.prefill_choice import PrefillChooser
from policies.types import Fingerprint


def _fp(*blocks: int, size: int = 1000) -> Fingerprint:
    return tuple((b, size) for b in blocks)


def test_a_cold_prompt_goes_to_the_shorter_queue_then_the_first() -> None:
    c = PrefillChooser()
    first = c.pick(["p0", "p1"], _fp(1, 2), 2000)
    assert first is not None and first.backend == "p0" and first.reason == "least_wait"
    c.started("r1", "p0", _fp(1, 2), 2000, 0)
    second = c.pick(["p0", "p1"], _fp(7, 8), 2000)
    assert second is not None and second.backend == "p1"


def test_the_next_turn_goes_where_its_prefix_is() -> None:
    c = PrefillChooser()
    c.started("t1", "p1", _fp(1, 2, 3), 3000, 0)
    c.finished("t1", "p1")
    pick = c.pick(["p0", "p1"], _fp(1, 2, 3, 4), 4000)
    assert pick is not None
    assert (pick.backend, pick.matched_tokens, pick.reason) == ("p1", 3000, "prefix")


def test_a_long_queue_outweighs_a_short_prefix() -> None:
    c = PrefillChooser(load_bound=10.0)  # the bound out of the way: the cost alone decides
    c.started("old", "p1", _fp(1), 1000, 0)
    c.finished("old", "p1")
    c.started("busy", "p1", _fp(50, 51, 52, 53, 54), 50_000, 0)  # 50k tokens still to prefill on p1
    pick = c.pick(["p0", "p1"], _fp(1, 2), 2000)
    assert pick is not None and pick.backend == "p0"  # p1's 1k cached does not pay for its 50k queue


def test_long_prompts_with_one_prefix_do_not_pile_on_one_backend() -> None:
    c = PrefillChooser()
    c.started("seed", "p0", _fp(*range(100)), 100_000, 0)
    c.finished("seed", "p0")
    placed = []
    for i in range(6):  # six long turns sharing the 100k prefix, all in flight at once
        fp = _fp(*range(100), 1000 + i)
        pick = c.pick(["p0", "p1"], fp, 101_000)
        assert pick is not None
        c.started(f"r{i}", pick.backend, fp, 101_000, pick.matched_tokens)
        placed.append(pick.backend)
    assert placed.count("p0") >= 1 and placed.count("p1") >= 1
    assert max(c.legs("p0"), c.legs("p1")) <= 4  # ceil(1.25 * 6 / 2) = 4


def test_finished_legs_leave_the_queue_and_no_candidate_is_none() -> None:
    c = PrefillChooser()
    c.started("a", "p0", _fp(1), 1000, 0)
    assert c.legs("p0") == 1 and c.queue_tokens("p0") == 1000
    c.finished("a", "p0")
    c.finished("a", "p0")  # twice is harmless
    assert c.legs("p0") == 0 and c.queue_tokens("p0") == 0
    assert c.pick([], _fp(1), 1000) is None
    with pytest.raises(ValueError):
        PrefillChooser(load_bound=0.5)


def test_forget_drops_a_restarted_backends_cache() -> None:
    c = PrefillChooser()
    c.started("a", "p1", _fp(1, 2), 2000, 0)
    c.finished("a", "p1")
    c.forget("p1")
    pick = c.pick(["p0", "p1"], _fp(1, 2), 2000)
    assert pick is not None and pick.backend == "p0" and pick.matched_tokens == 0


def test_set_capacity_bounds_what_a_backend_is_believed_to_hold() -> None:
    c = PrefillChooser()
    c.set_capacity("p1", 2000)
    c.started("a", "p1", _fp(1, 2, 3), 3000, 0)
    c.finished("a", "p1")
    pick = c.pick(["p1"], _fp(1, 2, 3), 3000)
    assert pick is not None and pick.matched_tokens == 2000  # two of three blocks fit: the leaf went
    c.set_capacity("p1", 0)  # unknown: the bound stays
    assert c.index.slot("p1").capacity == 2000


def test_equal_costs_go_to_fewer_legs_then_to_the_first() -> None:
    c = PrefillChooser()
    c.started("cached", "p0", _fp(9), 1000, 1000)  # a leg in flight with nothing left to prefill
    assert c.queue_tokens("p0") == 0 and c.legs("p0") == 1
    pick = c.pick(["p0", "p1"], _fp(5), 1000)
    assert pick is not None and pick.backend == "p1"
    c.finished("cached", "p0")
    pick = c.pick(["p1", "p0"], _fp(5), 1000)
    assert pick is not None and pick.backend == "p1"  # the candidates' order breaks the last tie


def test_min_slack_lets_the_prefix_holder_run_one_leg_more() -> None:
    def chooser(min_slack: int) -> PrefillChooser:
        c = PrefillChooser(load_bound=1.0, min_slack=min_slack)
        c.started("seed", "p0", _fp(1, 2, 3, 4), 4000, 0)
        c.finished("seed", "p0")
        c.started("busy", "p0", _fp(1, 2, 3, 4, 50), 5000, 5000)  # in flight, all of it cached
        return c

    strict = chooser(min_slack=1).pick(["p0", "p1"], _fp(1, 2, 3, 4, 6), 5000)
    assert strict is not None and strict.backend == "p1"  # p0 is at the bound: max(ceil(1·2/2), 0 + 1) = 1
    slack = chooser(min_slack=2).pick(["p0", "p1"], _fp(1, 2, 3, 4, 6), 5000)
    assert slack is not None and (slack.backend, slack.reason) == ("p0", "prefix")
