"""TTFT and tokens-per-minute arithmetic on a hand-made timeline."""

from __future__ import annotations

import pytest

from loadtest.results.metrics import RequestRecord, percentile, summarize, team_rows


def _timeline() -> list[RequestRecord]:
    R = RequestRecord
    return [
        # finished before the window: ignored for tokens, and its first token is before it too
        R(
            "a",
            slot=0,
            backend="b0",
            arrival=10,
            first_token=11,
            finish=20,
            prompt_tokens=1000,
            cached_tokens=0,
            output_tokens=100,
        ),
        # arrived before the window, first token inside it: its 70 s TTFT counts
        R(
            "b",
            slot=1,
            backend="b1",
            arrival=50,
            first_token=120,
            finish=130,
            prompt_tokens=100_000,
            cached_tokens=90_000,
            output_tokens=501,
        ),
        R(
            "c",
            slot=0,
            backend="b0",
            arrival=130,
            first_token=131,
            finish=141,
            prompt_tokens=50_000,
            cached_tokens=49_000,
            output_tokens=1001,
            team="t2",
        ),
        # first token inside, finishes after the window: TTFT counts, tokens do not
        R("d", slot=0, backend="b0", arrival=170, first_token=172, finish=200, prompt_tokens=7, output_tokens=7),
        # still waiting at the end: counts with its wait so far (180 - 150 = 30 s)
        R("e", slot=2, arrival=150),
        # refused: an error, not a TTFT sample
        R("f", slot=2, arrival=160, finish=160, ok=False, error="queue_timeout"),
    ]


def test_window_arithmetic() -> None:
    row = summarize(_timeline(), 60.0, 180.0, slots={0: "default", 1: "default", 2: "default"}, backends=["b0", "b1"])
    # two minutes; completed in window: b and c
    assert row["input_tpm"] == (100_000 + 50_000) / 2
    assert row["cached_tpm"] == (90_000 + 49_000) / 2
    assert row["output_tpm"] == (501 + 1001) / 2
    assert row["total_tpm"] == (150_000 + 1502) / 2
    assert row["completed_rpm"] == 1.0
    # TTFT samples: b 70, c 1, d 2, e 30 (waiting)
    assert row["ttft_p50_s"] == pytest.approx(16.0)
    assert row["ttft_p95_s"] == pytest.approx(70 - 0.15 * 40)
    assert row["max_wait_s"] == 70.0
    assert row["output_tps_p50"] == pytest.approx((500 / 10 + 1000 / 10) / 2)
    assert row["cache_hit_rate"] == pytest.approx(139_000 / 150_000, abs=1e-4)
    assert row["load_imbalance"] == pytest.approx(100_501 / ((100_501 + 51_001) / 2), abs=1e-3)
    assert row["errors"] == 1
    assert row["starved"] == 1  # slot 2 completed nothing in the window


def test_teams_and_percentile() -> None:
    teams = team_rows(_timeline(), 60.0, 180.0, {"default": 3, "t2": 1})
    assert teams["t2"] == {
        "conversations": 1,
        "completed_rpm": 0.5,
        "ttft_p50_s": 1.0,
        "ttft_p95_s": 1.0,
        "total_tpm": round(51_001 / 2),
    }
    assert teams["default"]["completed_rpm"] == 0.5
    assert percentile([], 50) is None
    assert percentile([3, 1, 2], 50) == 2
    assert percentile([0, 10], 95) == pytest.approx(9.5)
