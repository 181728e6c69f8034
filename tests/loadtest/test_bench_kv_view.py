"""The KV-view benchmark's tenants variants: the one-shot admission options reach the core as ``serve``
would read them from a config file."""

from __future__ import annotations

from pathlib import Path

from loadtest.bench import kv_view as bench_kv_view
from loadtest.sim.live import _load_config, build_core


def test_the_one_shot_variants_turn_both_options_on(tmp_path: Path) -> None:
    variants = dict(bench_kv_view._tenant_extra(tmp_path))
    assert {"gateway + one-shot options, approximate", "gateway + one-shot options, precise"} <= set(variants)
    change = variants["gateway + one-shot options, precise"]
    assert change["cache_view"] == "precise"
    core = build_core("gateway", config=_load_config(change["config"]))
    assert core.params.shared_blocks and core.params.release_first_turns  # type: ignore[attr-defined]
    assert not build_core("gateway").params.shared_blocks  # type: ignore[attr-defined]
