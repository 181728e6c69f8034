"""The engine model's vLLM variant: 16-token blocks and vLLM's eviction order (least recently freed
blocks first, a freed request's tail first) against SGLang's (least recently accessed leaf first); the
`gb10x16-*-vllm` profiles, and SGLang's profiles unchanged."""

from __future__ import annotations

import pytest

from backends.sim.engine import Engine, EngineRequest
from backends.sim.profiles import get_profile
from backends.sim.radix import RadixCache
from backends.sim.tokenizer import text_blocks


def _two_conversations(stamp_on_free: bool) -> set[int]:
    """A and B each hold two blocks; A is accessed after B but freed before it; one block is evicted."""
    cache = RadixCache(stamp_on_free=stamp_on_free)
    a1, _ = cache.put(cache.root, 1, 16)
    a2, _ = cache.put(a1, 2, 16)
    cache.lock(a2)
    b1, _ = cache.put(cache.root, 3, 16)
    b2, _ = cache.put(b1, 4, 16)
    cache.lock(b2)
    cache.touch_path(a2)  # A's next turn matched its prefix after B's
    cache.unlock(a2)  # ... and A finished first
    cache.unlock(b2)
    assert cache.evict(16) == 16
    return set(cache.nodes)


def test_vllm_evicts_the_least_recently_freed_tail_sglang_the_least_recently_accessed_leaf() -> None:
    assert _two_conversations(stamp_on_free=True) == {1, 3, 4}  # vLLM: A's tail block, freed first
    assert _two_conversations(stamp_on_free=False) == {1, 2, 3}  # SGLang: B's leaf, accessed longest ago


@pytest.mark.parametrize("base", ["gb10x16-tp4pp4-fp8", "gb10x16-tp16-fp8"])
def test_the_gb10_vllm_profiles(base: str) -> None:
    sglang, vllm = get_profile(base), get_profile(f"{base}-vllm")
    assert (vllm.page_size, vllm.eviction) == (16, "lrf")
    assert (sglang.page_size, sglang.eviction) == (64, "lru")
    assert vllm.kv_tokens == sglang.kv_tokens // 16 * 16 and vllm.a == sglang.a and vllm.r_lin == sglang.r_lin
    assert vllm.name in vllm.doc and f"{vllm.kv_tokens:,}" in vllm.doc


def test_a_vllm_engine_serves_a_conversation_from_its_16_token_blocks() -> None:
    engine = Engine(get_profile("gb10x16-tp4pp4-fp8-vllm"))
    prompt = "x" * 4 * 1000  # 1,000 tokens: 62 full blocks of 16 and a partial one
    done = []
    for turn, text in enumerate((prompt, prompt + "y" * 4 * 200)):
        req = EngineRequest(rid=f"t{turn}", prompt=text_blocks(text, 16), output_tokens=8, max_new_tokens=8,
                            final_blocks=text_blocks(text, 16))  # fmt: skip
        engine.submit(req, float(turn * 100))
        done += [e for e in engine.advance(float(turn * 100 + 99)) if e.kind == "finished"]
    assert [e.rid for e in done] == ["t0", "t1"]
    assert done[1].cached_tokens == 992  # the second turn found the first's 62 full blocks
