"""``backends/sim/demo_profile.py``: the live demo's profile is registered, and its constants give the
contrast its docstring promises: a cached turn in about 0.15 s, a full recompute in seconds."""

from __future__ import annotations

import pytest

from backends.sim.demo_profile import DEMO_FIELDS, DEMO_PROFILE
from backends.sim.engine import Engine, EngineRequest
from backends.sim.profiles import PROFILES, get_profile


def test_the_demo_profile_is_registered_with_its_fields() -> None:
    p = get_profile(DEMO_PROFILE)
    assert p is PROFILES["demo"] and p.name == "demo"
    assert all(getattr(p, name) == value for name, value in DEMO_FIELDS.items())


def test_a_cached_turn_costs_a_fraction_of_a_second_and_a_recompute_seconds() -> None:
    p = get_profile(DEMO_PROFILE)
    cached = p.solo_prefill_s(250, 5_000)  # about 250 new tokens over a 5k context
    full = p.solo_prefill_s(6_000, 0)  # the same context recomputed
    assert cached == pytest.approx(0.15, rel=0.1)
    assert full == pytest.approx(2.6, rel=0.05)
    assert full > 15 * cached


def test_answers_of_6_to_48_tokens_take_a_tenth_to_most_of_a_second() -> None:
    p = get_profile(DEMO_PROFILE)
    times = []
    for n in (6, 48):
        e = Engine(p)
        e.submit(EngineRequest("r", [(1, 5_000)], n, n), 0.0)
        events = {x.kind: x.time for x in e.advance(1e9)}
        times.append(events["finished"] - events["first_token"])
    assert 0.07 < times[0] < 0.12 and 0.6 < times[1] < 0.8


def test_the_pool_holds_six_of_the_longest_conversations() -> None:
    assert get_profile(DEMO_PROFILE).kv_tokens == 6 * 8_000
