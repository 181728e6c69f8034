"""``backends/sim/profiles_gb10.py``: the 16 × GB10 deployments (TP × PP over the nodes: the stage with the
most layers binds the KV pool) and a profile's vLLM variant (16-token blocks, least recently freed first)."""

from __future__ import annotations

import pytest

from backends.sim.profile_constants import GB10_MEM, LATENT_ELEMS, LAYERS, W_TOTAL
from backends.sim.profiles_gb10 import gb10, vllm_variant


@pytest.mark.parametrize(("tp", "pp", "layers"), [(16, 1, 61), (4, 4, 16), (2, 8, 8)])
def test_a_node_holds_its_stages_layers_and_the_pool_follows_its_memory(tp: int, pp: int, layers: int) -> None:
    p = gb10("g", tp=tp, pp=pp)
    assert p.kv_bytes_per_token_per_gpu == LATENT_ELEMS // LAYERS * layers  # fp8: one byte per element
    free = 0.82 * GB10_MEM - W_TOTAL / 16
    assert p.kv_tokens == int(free // p.kv_bytes_per_token_per_gpu) // 64 * 64
    assert (p.pp, p.tp_size, p.dp_size, p.page_size, p.chunked_prefill_size) == (pp, tp, 1, 64, 8192)
    assert p.weight_bytes_per_gpu == pytest.approx(W_TOTAL / 16)
    assert f"TP{tp}×PP{pp}" in p.doc and f"{p.kv_tokens:,}" in p.doc


def test_more_stages_mean_a_slower_step_but_a_bigger_pool() -> None:
    flat, staged = gb10("flat", tp=16, pp=1), gb10("staged", tp=4, pp=4)
    assert staged.kv_tokens > 3 * flat.kv_tokens
    assert staged.a > flat.a  # four stages of launches and all-reduces, one after another
    assert staged.r_lin == flat.r_lin and staged.k_attn == flat.k_attn  # prefill over all 16 nodes either way


def test_the_vllm_variant_changes_blocks_and_eviction_only() -> None:
    base = gb10("gb10x16-tp4pp4-fp8", tp=4, pp=4).with_(kv_tokens=1_000_010)
    v = vllm_variant(base)
    assert (v.name, v.page_size, v.kv_tokens, v.eviction) == ("gb10x16-tp4pp4-fp8-vllm", 16, 1_000_000, "lrf")
    assert v.doc.startswith("gb10x16-tp4pp4-fp8-vllm: gb10x16-tp4pp4-fp8 served by vLLM") and base.doc in v.doc
    assert v.with_(name=base.name, page_size=64, kv_tokens=base.kv_tokens, eviction="lru") == base
