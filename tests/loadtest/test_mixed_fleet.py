"""A mixed fleet in the simulator (``--profile A+B``): each backend runs its own profile, a vLLM variant is
seen as vLLM reports itself, and ``loadtest/analysis/mixed_fleet.py`` sets the gateway beside the partition (each
engine alone with half the conversations)."""

from __future__ import annotations

from loadtest.analysis import mixed_fleet
from loadtest.sim.driver import SimPool
from loadtest.sim.simulate import SimConfig, Simulator, build_core, default_engine_factory, fleet_profiles
from loadtest.workloads.spec import make_workload

SGLANG, VLLM = "gb10x16-tp4pp4-fp8", "gb10x16-tp4pp4-fp8-vllm"


def test_each_backend_runs_its_profile_in_turn_and_a_vllm_one_reports_as_vllm() -> None:
    assert fleet_profiles(f"{SGLANG}+{VLLM}") == [SGLANG, VLLM]
    factory = default_engine_factory(SimConfig(profile=f"{SGLANG}+{VLLM}", backends=3))
    engines = {f"b{i}": factory() for i in range(3)}
    assert [e.profile.name for e in engines.values()] == [SGLANG, VLLM, SGLANG]
    pool = SimPool("kimi", engines, lambda: 0.0)
    pool.check_health(0.0)
    views = {v.name: v for v in pool.views()}
    assert {n: b.engine for n, b in pool.backends.items()} == {"b0": "sglang", "b1": "vllm", "b2": "sglang"}
    assert views["b1"].kv_tokens == engines["b1"].max_total_num_tokens  # from cache_config_info
    assert views["b1"].max_running_requests == 0  # vLLM publishes no running cap
    assert views["b0"].max_running_requests == engines["b0"].profile.max_running_requests


def test_first_slot_runs_the_later_slots() -> None:
    cfg = SimConfig(profile="tiny", conversations=3, first_slot=4, minutes=2, warmup_minutes=0)
    engine = default_engine_factory(cfg)()
    sim = Simulator(cfg, build_core("direct"), {"b0": engine}, make_workload("coding-agent"), None)
    assert {r.slot for r in sim.run()} == {4, 5, 6}


def test_the_mixed_fleet_table_sets_each_stack_beside_the_partition() -> None:
    rows = mixed_fleet.run([SGLANG, VLLM], [4], [1], minutes=12, warmup=2, jobs=2)
    (row,) = rows
    assert set(row) >= {"gateway", "sglang-cache-aware", "direct", "partition"}
    assert row["partition"]["total_tpm"] > 0 and row["partition"]["starved"] == 0
    assert row["gateway"]["starved"] == 0
    # with prompt affinity the fleet keeps its caches; without it (direct alternates) it recomputes
    assert row["gateway"]["cache_hit_rate"] > row["direct"]["cache_hit_rate"]
    text = mixed_fleet.table(rows, [SGLANG, VLLM])
    assert "| 4 | 1 | partition |" in text and "| 4 | 1 | gateway |" in text
