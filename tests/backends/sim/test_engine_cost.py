"""``backends/sim/engine_cost.py``: how long a prefill batch and a decode step take on a profile:
the formulas of the module docstring, term by term (pipeline stages, the running cap on ``b``, speculative
decoding, host-tier loads, prefill efficiency)."""

from __future__ import annotations

import pytest

from backends.sim.engine_cost import decode_rank_time, decode_shared_time, prefill_parts, prefill_time
from backends.sim.engine_state import RankState, ReqState
from backends.sim.engine_types import EngineCounters, EngineRequest
from backends.sim.profiles import get_profile

TINY = get_profile("tiny")


def running(n: int, ctx_sum: int) -> RankState:
    rk = RankState(0, 10**9, 0, 0.7, EngineCounters())
    for i in range(n):
        rk.running[f"r{i}"] = ReqState(EngineRequest(f"r{i}", [(i + 1, 10)], 5, 5), 0, rk.cache.root)
    rk.ctx_sum = ctx_sum
    return rk


def test_the_shared_step_streams_more_experts_as_the_batch_grows() -> None:
    p = TINY
    one = decode_shared_time(p, 1)
    assert one == pytest.approx(p.a + p.t_experts * (p.experts_per_token / p.num_experts))
    assert decode_shared_time(p, 0) == one  # at least one request's worth
    big = decode_shared_time(p, 10_000)
    assert big == pytest.approx(p.a + p.t_experts, rel=1e-6)  # full coverage
    assert one < decode_shared_time(p, 50) < big


def test_pipeline_stages_see_a_pp_th_of_the_batch() -> None:
    p = TINY.with_(pp=4)
    assert decode_shared_time(p, 8) == pytest.approx(decode_shared_time(TINY, 2))
    assert decode_shared_time(p, 2) == pytest.approx(decode_shared_time(TINY, 1))  # fewer than pp: one at a time


def test_speculative_decoding_carries_the_drafts_and_yields_the_accept_length() -> None:
    p = TINY.with_(spec_draft_tokens=2, spec_accept_length=2.5)
    cov = 1 - (1 - p.experts_per_token / p.num_experts) ** 3  # d + 1 tokens per request
    shared = decode_shared_time(p, 1)
    assert shared == pytest.approx(p.a * (1 + 0.1 * 2) + p.t_experts * cov)
    rk = running(1, 1000)
    expected = (shared + p.b * 3 + p.k_kv * 1000 * 1.1) / 2.5
    assert decode_rank_time(p, rk, shared) == pytest.approx(expected)


def test_a_ranks_step_is_shared_plus_per_request_compute_capped_plus_kv_reads() -> None:
    p = TINY
    rk = running(3, 9000)
    assert decode_rank_time(p, rk, 0.01) == pytest.approx(0.01 + p.b * 3 + p.k_kv * 9000)
    capped = running(100, 9000)
    assert decode_rank_time(p, capped, 0.0) == pytest.approx(p.b * p.b_cap + p.k_kv * 9000)  # b_cap = 64
    staged = TINY.with_(pp=4)
    # two requests through four stages: every stage reads its context in turn (pp / min(B, pp) = 2)
    assert decode_rank_time(staged, running(2, 1000), 0.0) == pytest.approx(staged.b * 2 + staged.k_kv * 1000 * 2)


def test_prefill_is_linear_plus_attention_over_the_computed_prefix_plus_host_loads() -> None:
    p = TINY.with_(k_kvb=1e-8, host_load_tokens_per_s=1e6, prefill_efficiency=0.5)
    r = ReqState(EngineRequest("r", [(1, 10)], 1, 1), 0, running(0, 0).cache.root)
    items = [(r, 1000, 0), (r, 500, 3000), (r, -2000, 0)]  # a host-tier load of 2,000 tokens
    base, attn = prefill_parts(p, items)
    assert base == pytest.approx((p.t0 + 1500 / p.r_lin) / 0.5 + 2000 / 1e6)
    assert attn == pytest.approx((p.k_attn * (1000 * 500 + 500 * 3250) + 1e-8 * 3000) / 0.5)
    assert prefill_time(p, items) == pytest.approx(base + attn)
    assert prefill_time(p, [(r, 1000, 0)]) == pytest.approx(p.chunk_prefill_s(1000, 0))
    assert prefill_parts(p, []) == (pytest.approx(p.t0 / 0.5), 0.0)  # an empty pass still pays t0
