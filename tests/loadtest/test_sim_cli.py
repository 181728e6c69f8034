"""`cachegate simulate` end to end with the real engine: flags, JSON rows, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gateway.cli import app

runner = CliRunner()


def test_simulate_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    res = runner.invoke(
        app,
        [
            "simulate",
            "--profile",
            "tiny",
            "--backends",
            "2",
            "--policy",
            "direct",
            "--workload",
            "coding-agent",
            "--conversations",
            "2,4",
            "--minutes",
            "2",
            "--warmup-minutes",
            "0.5",
            "--scale",
            "0.032",
            "--seed",
            "3",
            "--jobs",
            "1",
            "--json",
            str(out),
        ],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    runs = json.loads(out.read_text())["runs"]
    assert [r["conversations"] for r in runs] == [2, 4]
    for r in runs:
        assert r["policy"] == "direct" and r["profile"] == "tiny" and r["backends"] == 2 and r["seed"] == 3
        assert r["completed_rpm"] > 0 and r["total_tpm"] > r["output_tpm"] > 0
        assert 0 <= r["cache_hit_rate"] <= 1 and r["starved"] == 0
        assert set(r["teams"]) == {"default"}
    assert "Total tok/min" in res.output


def test_simulate_teams_and_trace(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"timestamp": 200 * i, "input_length": 900, "output_length": 20, "hash_ids": [0, i + 1]})
            for i in range(200)
        )
    )
    config = tmp_path / "teams.yaml"
    config.write_text("teams:\n  a: {max_concurrency: 4, weight: 1}\n")
    res = runner.invoke(
        app,
        [
            "simulate",
            "--profile",
            "tiny",
            "--workload",
            f"trace:{trace}",
            "--minutes",
            "1",
            "--warmup-minutes",
            "0",
            "--teams",
            "a:1,b:1",
            "--speedup",
            "2",
            "--json",
            str(out),
            "--config",
            str(config),
        ],
    )
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())["runs"]
    assert row["conversations"] is None and set(row["teams"]) == {"a", "b"}
    assert row["teams"]["a"]["conversations"] is None
    assert row["completed_rpm"] > 150  # 200 requests over 20 s at speedup 2, all inside the minute


def test_simulate_errors_are_clear() -> None:
    base = ["simulate", "--profile", "tiny", "--minutes", "1"]
    for extra, msg in (
        (["--policy", "nope"], "unknown policy"),
        (["--profile", "nope"], "unknown profile"),
        (["--workload", "chat"], "unknown workload"),
        (["--admission", "x"], "unknown admission"),
        (["--routing", "x"], "unknown routing"),
        (["--conversations", "a,b"], "comma-separated"),
        (["--config", "/nonexistent.yaml"], "not found"),
    ):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2, (extra, res.output)
        assert msg in res.output, (extra, res.output)


def test_simulate_warm_start_enters_conversations_midway(tmp_path: Path) -> None:
    def run(*extra: str) -> dict:
        out = tmp_path / f"runs{len(extra)}.json"
        args = ["simulate", "--profile", "tiny", "--conversations", "4", "--minutes", "1", "--warmup-minutes", "0"]
        args += ["--scale", "0.032", "--jobs", "1", "--json", str(out), *extra]
        res = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text())["runs"][0]

    cold, warm = run(), run("--warm-start")
    assert (cold["warm_start"], warm["warm_start"]) == (False, True)
    # The first requests carry their conversations' history: more prompt per completed request.
    assert warm["input_tpm"] / warm["completed_rpm"] > cold["input_tpm"] / cold["completed_rpm"]
