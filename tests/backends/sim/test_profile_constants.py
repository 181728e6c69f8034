"""``backends/sim/profile_constants.py``: the model and hardware figures, against the derivations the
profiles' docs state for them (Kimi K2's shapes), and the GB10 per-stage decode overhead."""

from __future__ import annotations

import pytest

from backends.sim import profile_constants as k


def test_the_model_figures_follow_kimi_k2s_shapes() -> None:
    assert k.LATENT_ELEMS == 35_136 == (512 + 64) * 61  # MLA latent per token, all layers
    assert pytest.approx(2.5e6, rel=0.01) == k.ATTN_FLOPS  # 2 × 64 heads × (192 + 128) × 61
    assert pytest.approx(1.0e9, rel=0.03) == k.KVB_FLOPS  # kv_b_proj re-expansion per prefix token
    experts = 60 * 384 * 3 * 7168 * 2048 * 4.5 / 8  # MoE layers × experts × 3 matrices × 7168 × 2048 at 4.5 bits
    assert pytest.approx(experts, rel=0.01) == k.W_EXPERTS
    assert pytest.approx(24e9, rel=0.01) == k.W_TOTAL - k.W_EXPERTS  # the bf16 rest: attention, shared, embeddings
    assert k.EXPERTS_PER_TOKEN / k.NUM_EXPERTS == 8 / 384


def test_gb10_effective_bf16_is_half_rate() -> None:
    assert k.GB10_BF16_EFFECTIVE == k.GB10_BF16 / 2 == pytest.approx(62.5e12)


@pytest.mark.parametrize(("tp", "hops"), [(1, 1), (2, 1), (4, 2), (8, 3), (16, 4)])
def test_a_gb10_stage_pays_launches_and_two_all_reduces_per_layer_of_log2_tp_hops(tp: int, hops: int) -> None:
    assert k._gb10_stage_overhead(tp, 16) == pytest.approx(1.5e-3 + 2 * 16 * hops * 25e-6)
