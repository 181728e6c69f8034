"""Plain data parallelism (``--tp 4 --dp 2``): ``b300-tp4-fp8`` is one whole-model TP4 replica on half
the node, and the DP controller's round robin over two of them is the collapsing profile's miss source."""

from __future__ import annotations

import pytest

from backends.sim import profiles
from backends.sim.profiles import get_profile
from loadtest.sim.simulate import SimConfig, run_one


def test_tp4_replica_is_half_the_node_with_the_whole_model() -> None:
    tp4, tp8 = get_profile("b300-tp4-fp8"), get_profile("b300-tp8-fp8")
    # Whole weights on 4 GPUs: 595 GB / 4 per GPU, the rest of 0.9 × 288 GB holds fp8 latents.
    assert tp4.kv_tokens == pytest.approx((0.9 * 288e9 - 595e9 / 4) / 35136, rel=0.001)
    assert tp4.kv_tokens < 0.6 * tp8.kv_tokens
    assert tp4.r_lin == pytest.approx(tp8.r_lin / 2)  # half the GPUs for the linear part
    assert tp4.k_attn == pytest.approx(2 * tp8.k_attn)  # and for the attention
    assert tp4.t_experts == pytest.approx(2 * tp8.t_experts)  # twice the expert bytes per GPU
    assert tp4.k_kv == tp8.k_kv  # each GPU still reads its requests' whole latent
    assert (tp4.dp_size, tp4.chunked_prefill_size, tp4.init_new_token_ratio) == (1, 16384, 0.7)
    # Only the front end is taken from the fit, and the profile says so.
    fit = profiles.GOOD_FIT
    assert tp4.fitted == ("tokenize_tokens_per_s", "request_overhead_s")
    assert (tp4.tokenize_tokens_per_s, tp4.request_overhead_s) == (fit.tokenize_tokens_per_s, fit.request_overhead_s)
    assert "--tp 4 --dp 2" in tp4.doc and "round_robin" in tp4.doc


def test_round_robin_over_two_replicas_misses_what_the_other_served() -> None:
    def run(backends: int) -> dict:
        cfg = SimConfig(
            profile="b300-tp4-fp8", policy="direct", backends=backends, conversations=8, minutes=8, warmup_minutes=3
        )
        return run_one(cfg)

    one, two = run(1), run(2)
    # One replica keeps every conversation's whole history; two behind round robin recompute the turns
    # the other replica served, so hits fall and the median first token waits for that recompute.
    assert one["cache_hit_rate"] > 0.96
    assert two["cache_hit_rate"] < one["cache_hit_rate"] - 0.02
    assert two["ttft_p50_s"] > 1.5 * one["ttft_p50_s"]


@pytest.mark.slow
def test_the_pair_collapses_once_conversations_are_mature() -> None:
    # docs/calibration.md's steady state: conversations entered at random turns, 40 minutes, the first
    # 20 excluded. 16 mature conversations (~2.5M tokens) fit one replica's 3.14M, 48 do not: both
    # replicas then recompute nearly every prompt, and tokens/min falls below a third of the 16 level.
    def run(n: int) -> dict:
        cfg = SimConfig(
            profile="b300-tp4-fp8",
            policy="direct",
            backends=2,
            conversations=n,
            minutes=40,
            warmup_minutes=20,
            warm_start=True,
        )
        return run_one(cfg)

    light, heavy = run(16), run(48)
    assert light["cache_hit_rate"] > 0.9 and light["warm_start"] is True
    assert heavy["total_tpm"] <= light["total_tpm"] / 3
    assert heavy["cache_hit_rate"] < 0.6
    # Mature conversations: well over 100k tokens per completed request at both levels.
    for row in (light, heavy):
        assert row["total_tpm"] / row["completed_rpm"] > 120_000
