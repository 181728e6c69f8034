"""Profiles: names, capacities derived from memory, shared utilisation, documented derivations."""

from __future__ import annotations

import pytest

from backends.sim import profiles
from backends.sim.engine import UNBOUNDED_TOKENS, Engine
from backends.sim.profiles import PROFILES, get_profile

NAMES = [
    "b300-tp8-bf16",
    "b300-tp8-fp8",
    "b300-tp8-fp8-hicache",
    "b300-dp8-fp8",
    "b300-dp8-fp8-cp",
    "gb10x16-tp4pp4-fp8",
    "gb10x16-tp16-fp8",
    "tiny",
]


def test_binding_names_exist_and_unknown_lists_them() -> None:
    assert set(NAMES) <= set(PROFILES)
    with pytest.raises(ValueError) as err:
        get_profile("nope")
    assert all(n in str(err.value) for n in NAMES)


@pytest.mark.parametrize(
    ("name", "approx"),
    [
        ("b300-tp8-bf16", 2.63e6),
        ("b300-tp8-fp8", 5.27e6),
        ("b300-tp8-fp8-hicache", 5.27e6),
        ("b300-dp8-fp8", 4.9e6),
        ("b300-dp8-fp8-cp", 4.9e6),
        ("b300-dp2-bf16", 2.6e6),  # DP2: each rank's 4 GPUs hold its latents, like TP4
        ("b300-tp4-fp8", 3.14e6),  # one whole-model replica of --tp 4 --dp 2
        ("gb10x16-tp4pp4-fp8", 7.4e6),
        ("gb10x16-tp16-fp8", 1.9e6),
        ("tiny", 64e3),
    ],
)
def test_capacity_matches_the_reference(name: str, approx: float) -> None:
    p = get_profile(name)
    assert p.kv_tokens == pytest.approx(approx, rel=0.03)
    assert p.kv_tokens % p.page_size == 0


def test_b300_profiles_share_compute_and_differ_only_where_physics_does() -> None:
    bf16, fp8, hi = (get_profile(n) for n in ("b300-tp8-bf16", "b300-tp8-fp8", "b300-tp8-fp8-hicache"))
    for attr in ("t0", "r_lin", "k_attn", "a", "t_experts", "b", "prefill_efficiency"):
        assert getattr(bf16, attr) == getattr(fp8, attr) == getattr(hi, attr), attr
    assert bf16.k_kv == pytest.approx(2 * fp8.k_kv)
    assert fp8.kv_tokens == pytest.approx(2 * bf16.kv_tokens, rel=0.001)
    assert hi.host_tier_tokens == 8_000_000 and fp8.host_tier_tokens == 0
    # 50 GB/s over the fp8 latent bytes each GPU holds
    assert hi.host_load_tokens_per_s == pytest.approx(50e9 / 35136)
    dp = get_profile("b300-dp8-fp8")
    assert dp.dp_size == 8 and dp.k_kv == fp8.k_kv  # per rank, over that rank's own Σctx
    assert dp.k_attn == pytest.approx(8 * fp8.k_attn)  # all heads of a request on one GPU
    for p in (bf16, fp8, hi):
        assert (p.context_length, p.chunked_prefill_size, p.init_new_token_ratio) == (262144, 16384, 0.7)
    # SGLang handle_data_parallelism: chunk // dp_size, schedule_conservativeness × 0.3
    assert (dp.context_length, dp.chunked_prefill_size) == (262144, 16384 // 8)
    assert dp.init_new_token_ratio == pytest.approx(0.7 * 0.3)
    dp2 = get_profile("b300-dp2-bf16")
    assert (dp2.dp_size, dp2.chunked_prefill_size) == (2, 16384 // 2)
    assert dp2.k_attn == pytest.approx(2 * bf16.k_attn)  # a rank's attention on 4 of the 8 GPUs


def test_constants_are_derived_from_the_stated_utilisation() -> None:
    fp8 = get_profile("b300-tp8-fp8")
    assert fp8.k_kv == pytest.approx(35136 / (profiles.B300_BW * profiles.U_BW))
    assert fp8.r_lin == pytest.approx(8 * profiles.B300_BF16 * profiles.U_LIN / 6.4e10)
    assert fp8.k_attn == pytest.approx(2.5e6 / (8 * profiles.B300_BF16 * profiles.U_ATTN), rel=0.01)
    # sanity against the reference's order of magnitude (§9), not a fit to the published curves
    full = fp8.t0 + 160_000 / fp8.r_lin + fp8.k_attn * 160_000**2 / 2
    assert 6 < full < 18


def test_every_profile_documents_its_derivation() -> None:
    for p in PROFILES.values():
        assert p.name in p.doc
        assert f"{p.kv_tokens:,}" in p.doc or p.name == "tiny"
        if p.name.startswith("b300"):
            assert "U_LIN" in p.doc and "U_ATTN" in p.doc and "U_BW" in p.doc
    assert "utilisation" in (profiles.__doc__ or "").lower()


def test_overrides() -> None:
    assert Engine(get_profile("tiny"), kv_tokens=12345).max_total_num_tokens == 12345
    e = Engine(get_profile("b300-tp8-bf16"), unbounded=True)
    assert e.max_total_num_tokens == UNBOUNDED_TOKENS
    assert get_profile("tiny").with_(schedule_policy="lpm").schedule_policy == "lpm"


def test_the_registry_holds_the_vllm_variants_the_dcp_node_and_the_demo() -> None:
    for name in ("gb10x16-tp4pp4-fp8-vllm", "gb10x16-tp16-fp8-vllm", "b300-tp8-fp8-dcp8", "demo"):
        assert PROFILES[name].name == name
    assert PROFILES["gb10x16-tp16-fp8-vllm"].eviction == "lrf" and PROFILES["gb10x16-tp16-fp8"].eviction == "lru"


def test_decode_context_parallelism_is_refused_where_it_does_not_apply() -> None:
    with pytest.raises(ValueError, match="dp 1 and dcp dividing the GPUs"):
        profiles._b300("x", kv_dtype_bytes=1, dp=8, dcp=8)
    with pytest.raises(ValueError, match="dp 1 and dcp dividing the GPUs"):
        profiles._b300("x", kv_dtype_bytes=1, dcp=3)
