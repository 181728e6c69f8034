"""The GPU pool's bound on waiting (``loadtest/analysis/kv_bound.py``): zero while the in-flight contexts fit the
pool, positive and below the measured waits when they do not."""

from __future__ import annotations

import pytest

from loadtest.analysis.kv_bound import measure, p95_floor, shaped_p95_floor
from loadtest.sim.simulate import SimConfig


def test_p95_floor_is_what_a_capped_set_of_waits_with_that_mean_needs() -> None:
    assert p95_floor(10.0, 40.0) == pytest.approx((10.0 - 2.0) / 0.95)
    assert p95_floor(1.0, 40.0) == 0.0
    waits = [0.0] * 94 + [40.0] * 6  # mean 2.4, max 40: p95 is 40, the floor below it
    assert p95_floor(sum(waits) / len(waits), 40.0) <= 40.0


def test_shaped_floor_is_the_pooled_one_for_one_segment_and_sharper_when_waits_grow() -> None:
    assert shaped_p95_floor([(10.0, 100)], 40.0) == pytest.approx(p95_floor(10.0, 40.0))
    assert shaped_p95_floor([(1.0, 100)], 40.0) == 0.0
    # Half the requests never wait, the other half wait 20 s on average, none more than 40 s: at best
    # 90 of the late ones at T and 10 (5% of 200) at 40 s, so 90·T + 400 = 2000 and T = 17.8 s,
    # where the pooled mean (10 s) alone allows 8.4 s.
    segments = [(0.0, 100), (20.0, 100)]
    floor = shaped_p95_floor(segments, 40.0)
    assert floor == pytest.approx(1600 / 90)
    assert floor > p95_floor(10.0, 40.0) + 9
    waits = sorted([0.0] * 100 + [floor] * 90 + [40.0] * 10)
    assert sum(waits[100:]) / 100 == pytest.approx(20.0)  # the shaping that reaches it keeps the mean
    assert waits[int(0.95 * len(waits)) - 1] == pytest.approx(floor)


def _run(kv_tokens: int | None) -> dict:
    cfg = SimConfig(
        profile="b300-tp8-fp8", policy="direct", conversations=16, minutes=8, warmup_minutes=2, kv_tokens=kv_tokens
    )
    return measure(cfg, segment_s=120.0)


@pytest.mark.slow
def test_the_bound_is_zero_when_everything_fits_and_bounds_the_waits_when_not() -> None:
    roomy = _run(None)
    assert roomy["wait_bound_mean_s"] == 0.0
    tight = _run(900_000)
    assert tight["pool_tokens"] == 900_000
    assert tight["wait_bound_mean_s"] > 1.0
    for seg in tight["segments"]:
        assert seg["inflight"] <= 16
        if seg["wait_bound_s"] and seg["wait_mean_s"] is not None and seg["requests"] > 5:
            assert seg["wait_bound_s"] <= seg["wait_mean_s"] * 1.05  # a lower bound on what was measured
    # Little's law: N = X (R + Z) over the window, to within the window's edges
    little = tight["x_per_s"] * (tight["response_s"] + tight["think_s"])
    assert little == pytest.approx(16, rel=0.15)
