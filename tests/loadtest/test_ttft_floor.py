"""The TTFT floor: every turn's own prefill alone on an idle rank with a perfect cache."""

from __future__ import annotations

import json

import pytest

from backends.sim.profiles import U_ATTN, get_profile
from loadtest.analysis import ttft_floor
from loadtest.workloads.core import CodingAgent


def test_turn_sizes_add_up_to_each_prompt() -> None:
    conv = CodingAgent(seed=1).conversation(0, 0)
    sizes = list(ttft_floor.turn_sizes(1, per_slot=1))
    assert len(sizes) == len(conv.turns)
    prompt = 0
    for n, ((u, c), turn) in enumerate(zip(sizes, conv.turns, strict=True)):
        prompt += sum(seg.tokens for seg in turn.new)
        assert u + c == prompt
        assert u > 0 and c > 0
        if n:
            assert u == sum(seg.tokens for seg in turn.new) + 1  # + the uncached last answer token
        prompt += turn.output_tokens


def test_dp_rank_floor_is_above_tp8_and_rows_are_ordered() -> None:
    dp = ttft_floor.floor_row(get_profile("b300-dp8-fp8"), 8)
    tp = ttft_floor.floor_row(get_profile("b300-tp8-fp8"), 8)
    assert dp["turns"] == tp["turns"] > 8
    for row in (dp, tp):
        assert 0 < row["floor_p25_s"] <= row["floor_p50_s"] <= row["floor_p75_s"]
        assert 0 <= row["share_within_target"] <= 1
    assert dp["floor_p50_s"] > 4 * tp["floor_p50_s"]
    assert dp["share_within_target"] < tp["share_within_target"]


def test_what_if_utilisation_rescales_attention_only() -> None:
    p = get_profile("b300-dp8-fp8")
    same = ttft_floor.at_attn_utilisation(p, U_ATTN)
    assert same.k_attn == pytest.approx(p.k_attn)
    faster = ttft_floor.at_attn_utilisation(p, 2 * U_ATTN)
    assert faster.k_attn == pytest.approx(p.k_attn / 2)
    assert faster.k_kvb == pytest.approx(p.k_kvb / 2)  # the re-expansion runs at the attention rate
    assert (faster.t0, faster.r_lin, faster.kv_tokens) == (p.t0, p.r_lin, p.kv_tokens)
    assert get_profile("b300-dp8-fp8").k_attn == p.k_attn  # the registry is untouched
    cp = get_profile("b300-dp8-fp8-cp")  # fitted at U_ATTN 0.6: the what-if starts from its own figure
    assert ttft_floor.at_attn_utilisation(cp, 0.6).k_attn == pytest.approx(cp.k_attn)


def test_cli_prints_json_rows(capsys: pytest.CaptureFixture[str]) -> None:
    ttft_floor.main(["--profiles", "b300-tp8-fp8", "--conversations", "2", "--json", "--attn-utilisation", "0.3,0.6"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["profile"] for r in rows] == ["b300-tp8-fp8 @ U_ATTN 0.3", "b300-tp8-fp8 @ U_ATTN 0.6"]
    assert rows[1]["floor_p50_s"] < rows[0]["floor_p50_s"]


def test_cli_simulates_a_policy_on_the_what_if_engine(capsys: pytest.CaptureFixture[str]) -> None:
    ttft_floor.main(
        [
            "--profiles",
            "b300-dp8-fp8",
            "--conversations",
            "4",
            "--json",
            "--simulate",
            "gateway",
            "--attn-utilisation",
            "0.3,1.0",
        ]
    )
    slow, fast = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    # nothing beats a turn's own prefill, and the what-if engine is the one simulated
    assert slow["gateway_ttft_p50_s"] >= slow["floor_p25_s"]
    assert fast["gateway_ttft_p50_s"] < slow["gateway_ttft_p50_s"]
