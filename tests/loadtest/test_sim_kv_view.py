"""``--cache-view precise``: the router's index follows the engine model's cache exactly."""

from __future__ import annotations

import pytest

import loadtest.sim.kv_view as kv
from loadtest.sim.simulate import SimConfig, run_one
from policies.kv_view import PreciseIndex


def test_precise_view_mirrors_every_engine_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}
    attach = kv.attach_precise_view

    def spy(core: object, engines: dict[str, object]) -> PreciseIndex:
        seen["index"], seen["engines"] = attach(core, engines), engines
        return seen["index"]  # type: ignore[return-value]

    monkeypatch.setattr(kv, "attach_precise_view", spy)
    cfg = SimConfig(
        profile="b300-tp8-fp8",
        backends=3,
        policy="gateway",
        conversations=24,
        minutes=3,
        warmup_minutes=1,
        kv_tokens=600_000,
        cache_view="precise",
    )
    row = run_one(cfg)
    assert row["cache_view"] == "precise" and row["cache_hit_rate"] > 0
    index: PreciseIndex = seen["index"]  # type: ignore[assignment]
    evicted = 0
    for name, engine in seen["engines"].items():  # type: ignore[attr-defined]
        cache = engine._ranks[0].cache
        mirror = index.mirrors[(name, None)]
        assert mirror.synced
        assert mirror.blocks == {k for k, n in cache.nodes.items() if n.on_gpu}
        evicted += cache.evicted_tokens
    assert evicted > 0  # the pools were under pressure, so removals were followed too


def test_precise_needs_a_router_with_an_index() -> None:
    with pytest.raises(ValueError, match="prefix index"):
        run_one(
            SimConfig(
                profile="tiny",
                backends=2,
                policy="round-robin",
                conversations=2,
                minutes=1,
                warmup_minutes=0,
                cache_view="precise",
            )
        )
