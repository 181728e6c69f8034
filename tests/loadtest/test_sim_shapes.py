"""Issue 4's acceptance shapes on the real engine profiles (`--policy direct`, coding-agent, 20 min)."""

from __future__ import annotations

from loadtest.sim.simulate import SimConfig, run_one


def _tpm(profile: str, n: int) -> int:
    return run_one(SimConfig(profile=profile, conversations=n))["total_tpm"]


def test_bf16_collapses_past_capacity() -> None:
    peak = max(_tpm("b300-tp8-bf16", 8), _tpm("b300-tp8-bf16", 16))
    assert _tpm("b300-tp8-bf16", 32) <= peak / 3
    assert _tpm("b300-tp8-bf16", 48) <= peak / 3


def test_fp8_hicache_holds_through_48() -> None:
    assert _tpm("b300-tp8-fp8-hicache", 48) >= _tpm("b300-tp8-fp8-hicache", 16)


def test_simulation_is_deterministic() -> None:
    cfg = SimConfig(profile="b300-tp8-bf16", conversations=8, minutes=4, warmup_minutes=1)
    assert run_one(cfg) == run_one(cfg)
    other = run_one(SimConfig(profile="b300-tp8-bf16", conversations=8, minutes=4, warmup_minutes=1, seed=2))
    assert other != run_one(cfg)
