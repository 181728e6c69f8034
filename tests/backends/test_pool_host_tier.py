"""A backend's HiCache host tier comes from the config (SGLang does not report it), reaches the
backend view the gateway's admission sizes seats with, and is refused when half given."""

from __future__ import annotations

import asyncio

import pytest

from backends.pool import BackendPool
from backends.sim.testing import run_twin
from gateway.config.schema import Config
from policies.admission import SeatedAdmission
from policies.routing import RoundRobin
from policies.types import BackendView, Dispatch, RequestFacts


def _views(url: str, tier: dict[str, float]) -> list[BackendView]:
    async def fetch() -> list[BackendView]:
        config = Config.model_validate({"models": {"kimi": {"backends": [{"url": url, **tier}]}}})
        pool = BackendPool(config)
        await pool.start()
        try:
            return pool.views("kimi")
        finally:
            await pool.stop()

    return asyncio.run(fetch())


def test_a_configured_host_tier_reaches_the_view_and_widens_the_seat_budget() -> None:
    with run_twin("b300-tp8-fp8-hicache", time_scale=0.05) as url:
        tiered = _views(url, {"host_tier_tokens": 8_000_000, "host_load_tokens_per_s": 1_400_000})[0]
        plain = _views(url, {})[0]
    assert (tiered.host_tokens, tiered.reload_tokens_per_s) == (8_000_000, 1_400_000)
    assert (plain.host_tokens, plain.reload_tokens_per_s) == (0, 0.0)
    assert tiered.kv_tokens == plain.kv_tokens == 5_260_224  # the GPU pool the server reports

    def seated(view: BackendView) -> int:
        """Conversations needing 200k tokens each that get a seat at once."""
        core = SeatedAdmission(RoundRobin())
        core.set_backends("kimi", [view], 0.0)
        out = []
        for i in range(64):
            facts = RequestFacts(f"r{i}", "kimi", prompt_tokens=200_000 - 1024, conversation=f"c{i}")
            out += core.arrive(facts, 0.0)
        return sum(isinstance(d, Dispatch) for d in out)

    # Arriving together, conversations are seated while the demand fits kv_overbook (1.1) × the pool
    # (policies/admission/sizing.py): the GPU pool alone, 1.1 × 5.26M, holds 28 such seats; with the
    # host tier, 1.1 × 13.26M = 14.6M holds all 64 (12.8M).
    assert (seated(plain), seated(tiered)) == (28, 64)


def test_a_host_tier_without_its_reload_rate_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="host_tier_tokens and host_load_tokens_per_s"):
        Config.model_validate({"models": {"kimi": {"backends": [{"url": "http://h:1", "host_tier_tokens": 10}]}}})
