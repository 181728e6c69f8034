"""`cachegate plan` on a small case (``tiny`` servers, contexts at 1/30 scale): the recommended fleet
meets the targets on seeds it never saw, and one server fewer does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli import app
from loadtest.plan.recommend import PlanConfig, Planner, Targets, parse_teams, run_plan

SMALL = dict(
    profiles=["tiny"],
    targets=Targets(ttft_p50_s=1.0, ttft_p95_s=5.0, max_wait_s=30.0),
    seeds=(1, 2),
    verify_seeds=(3, 4),
    minutes=5.0,
    warmup_minutes=1.0,
    scale=0.032,
    jobs=2,
)


def test_recommended_fleet_holds_on_other_seeds_and_one_less_does_not() -> None:
    cfg = PlanConfig(teams=parse_teams("a:8:2,b:8:2"), **SMALL)  # type: ignore[arg-type]
    plan = run_plan(cfg)
    result = plan["profiles"][0]
    n = result["servers"]
    assert n is not None and n >= 2
    assert result["verify"]["meets"]  # the planner's own check, with the team limits, on seeds 3 and 4
    assert set(result["teams"]) == {"a", "b"} and all(t["max_queue"] == 16 for t in result["teams"].values())
    frontier = {p["servers"]: p for p in result["frontier"]}
    rejected = {x["servers"] for x in result["rejected"]}  # met on the search seeds, missed on the check's
    assert frontier[n]["meets"] and (not frontier[n - 1]["meets"] or n - 1 in rejected)
    # Independently: seeds neither the search nor the planner's verification used.
    planner = Planner(PlanConfig(teams=cfg.teams, **{**SMALL, "jobs": 1}))  # type: ignore[arg-type]
    config = {"teams": result["teams"]}
    assert planner.evaluate("tiny", n, (7, 8), config=config).meets
    assert not planner.evaluate("tiny", n - 1, (7, 8), config=config).meets


def test_parse_teams_rejects_bad_input() -> None:
    assert [t.conversations for t in parse_teams("web:80:1.5, data:3:0.4")] == [120, 1]
    for bad in ("web:80", "web:x:1", "web:10:0", "a:1:1,a:2:1", ""):
        with pytest.raises(ValueError):
            parse_teams(bad)


def test_cli_writes_frontier_and_snippet(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = CliRunner().invoke(
        app,
        [
            "plan",
            "--teams",
            "a:2:1,b:2:1",
            "--profile",
            "tiny",
            "--scale",
            "0.032",
            "--minutes",
            "3",
            "--warmup-minutes",
            "1",
            "--seeds",
            "1",
            "--verify-seeds",
            "2",
            "--ttft-p50",
            "1",
            "--ttft-p95",
            "5",
            "--max-wait",
            "30",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "tiny: 1 server(s)" in res.output
    snippet = yaml.safe_load((out / "teams-tiny.yaml").read_text())
    assert snippet["policy"] == "gateway" and set(snippet["teams"]) == {"a", "b"}
    assert (out / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    bad = CliRunner().invoke(app, ["plan", "--teams", "a:2", "--profile", "tiny"])
    assert bad.exit_code == 2 and "NAME:DEVELOPERS" in bad.output


def test_the_plan_simulates_and_writes_the_wait_bound() -> None:
    from loadtest.plan.recommend import bound_config, teams_config

    teams = parse_teams("a:4:2,b:2:1")
    targets = Targets(max_wait_s=90.0)
    written = teams_config(teams, {"a": 3, "b": 1}, targets)
    assert {n: t["max_wait_s"] for n, t in written.items()} == {"a": 90.0, "b": 90.0}
    searched = bound_config(teams, targets)["teams"]
    assert searched["a"] == {"max_concurrency": 8, "max_queue": 8, "queue_timeout_s": 300.0, "max_wait_s": 90.0}
    # the core the search builds plans for that bound
    from loadtest.sim.live import build_core

    core = build_core("gateway", config=bound_config(teams, targets))
    assert core.team("a", 0.0).limits.max_wait_s == 90.0  # type: ignore[union-attr]
