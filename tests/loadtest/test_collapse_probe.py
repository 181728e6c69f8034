"""The collapse probe's figures are consistent with the run they describe."""

from __future__ import annotations

from loadtest.analysis.collapse_probe import probe


def test_one_backend_never_switches_and_two_replicas_do() -> None:
    one = probe("b300-tp8-bf16", 1, 4, seed=1, minutes=3.0, warmup=1.0)
    assert one["switch"]["switched"]["turns"] == 0
    assert one["switch"]["same"]["turns"] > 0
    two = probe("b300-tp4-fp8", 2, 4, seed=1, minutes=3.0, warmup=1.0)
    # Round robin over two replicas: about half the turns land away from the previous turn's replica,
    # and those find less of their prompt cached there.
    same, switched = two["switch"]["same"], two["switch"]["switched"]
    assert switched["turns"] > 0 and same["turns"] > 0
    assert switched["hit_mean"] < same["hit_mean"]
    for row in (one, two):
        assert 0.0 < row["prefill_time_share"] < 1.0
        assert 0.0 <= row["computed_share"] <= 1.0
        assert sum(c["turns"] for c in row["hit_classes"].values()) == row["turns"]
