"""``backends/sim/profile_model.py``: the ``Profile`` record and its time formulas (one chunk, a request's
whole prefill alone on an idle rank, the per-request overhead), the KV size per GPU, and SGLang's
default running cap."""

from __future__ import annotations

import dataclasses

import pytest

from backends.sim.profile_model import Profile, coverage_note, default_max_running
from backends.sim.profiles import get_profile

TINY = get_profile("tiny")


def test_one_chunk_costs_the_fixed_linear_attention_and_re_expansion_terms_over_efficiency() -> None:
    p = TINY.with_(k_kvb=2e-9, prefill_efficiency=0.8)
    expected = (p.t0 + 1000 / p.r_lin + p.k_attn * 1000 * (3000 + 500) + 2e-9 * 3000) / 0.8
    assert p.chunk_prefill_s(1000, 3000) == pytest.approx(expected)
    assert p.chunk_prefill_s(0, 0) == pytest.approx(p.t0 / 0.8)


def test_a_solo_prefill_is_its_chunks_one_after_another_plus_the_overhead() -> None:
    p = TINY.with_(request_overhead_s=0.05, tokenize_tokens_per_s=10_000.0)  # chunks of 2048
    chunks = p.chunk_prefill_s(2048, 1000) + p.chunk_prefill_s(2048, 3048) + p.chunk_prefill_s(904, 5096)
    assert p.solo_prefill_s(5000, 1000) == pytest.approx(0.05 + 6000 / 10_000 + chunks)
    assert p.solo_prefill_s(0, 1000) == pytest.approx(p.overhead_s(1000))  # everything cached: overhead only


def test_the_overhead_is_a_fixed_part_plus_tokenisation_when_modelled() -> None:
    assert TINY.overhead_s(100_000) == 0.0
    assert TINY.with_(request_overhead_s=0.02).overhead_s(100_000) == 0.02
    assert TINY.with_(tokenize_tokens_per_s=1e6).overhead_s(250_000) == pytest.approx(0.25)


def test_kv_size_per_gpu_is_one_ranks_tokens_a_dcp_th_of_them_under_dcp() -> None:
    p = TINY.with_(kv_tokens=1_000_000, kv_bytes_per_token_per_gpu=35_136)
    assert p.kv_gb_per_gpu == pytest.approx(35.136)
    assert p.with_(dcp_size=8).kv_gb_per_gpu == pytest.approx(35.136 / 8)
    assert TINY.kv_gb_per_gpu == 0.0  # the toy profile states no bytes per token


def test_with_makes_a_changed_copy_and_the_doc_takes_no_part_in_equality() -> None:
    lpm = TINY.with_(schedule_policy="lpm")
    assert lpm.schedule_policy == "lpm" and TINY.schedule_policy == "fcfs"
    assert TINY.with_(doc="another text") == TINY
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY.kv_tokens = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        TINY.with_(no_such_field=1)
    assert isinstance(lpm, Profile)


@pytest.mark.parametrize(
    ("kv_tokens", "context", "expected"),
    [(1_000, 262_144, 2048), (5_000_000, 262_144, 4096), (1_048_576, 262_144, 2048), (1_572_864, 262_144, 3072)],
)
def test_sglangs_default_running_cap_is_clamped_to_2048_4096(kv_tokens: int, context: int, expected: int) -> None:
    assert default_max_running(kv_tokens, context) == expected


def test_the_coverage_note_states_the_expert_stream_time_and_the_top_k() -> None:
    note = coverage_note(0.0123)
    assert "t_experts = 12.3 ms" in note and "8/384" in note
