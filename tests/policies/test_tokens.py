"""policies/tokens.py: prompt tokens estimated from bytes, the ratio learned from reported usage."""

from __future__ import annotations

import pytest

from policies.tokens import TokenEstimator


def test_estimate_is_bytes_times_the_ratio_and_at_least_one() -> None:
    est = TokenEstimator()
    assert est.ratio == 0.25
    assert est.estimate(4000) == 1000
    assert est.estimate(0) == 1  # an empty prompt still costs a token
    assert est.estimate(1) == 1
    assert TokenEstimator(initial=0.5).estimate(4000) == 2000


def test_one_observation_moves_the_ratio_by_alpha_of_the_gap() -> None:
    est = TokenEstimator(initial=0.25, alpha=0.05, min_bytes=256)
    est.observe(1000, 500)  # 0.5 tokens per byte observed
    assert est.ratio == pytest.approx(0.25 + 0.05 * (0.5 - 0.25))
    assert est.estimate(4000) == round(4000 * est.ratio)


def test_small_requests_and_unreported_tokens_teach_nothing() -> None:
    est = TokenEstimator(min_bytes=256)
    est.observe(255, 1000)  # below min_bytes: dominated by the chat template's own tokens
    est.observe(10_000, 0)  # no usage reported
    est.observe(10_000, -5)
    assert est.ratio == 0.25
    est.observe(256, 256)  # exactly min_bytes counts
    assert est.ratio > 0.25


def test_the_ratio_converges_to_what_the_backend_reports() -> None:
    est = TokenEstimator()
    for _ in range(300):
        est.observe(3000, 1000)  # 3 bytes per token
    assert est.ratio == pytest.approx(1 / 3, rel=1e-4)
    assert est.estimate(3000) == 1000


def test_alpha_one_takes_the_last_observation() -> None:
    est = TokenEstimator(alpha=1.0)
    est.observe(1000, 200)
    assert est.ratio == pytest.approx(0.2)
    est.observe(2000, 1000)
    assert est.ratio == pytest.approx(0.5)
