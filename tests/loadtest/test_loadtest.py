"""The live client against a real simulated SGLang server (the twin) on loopback, and the demo."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli import app
from loadtest.demo.run import DemoConfig, free_port, run_demo
from loadtest.live.client import LevelState, LiveConfig, run_level
from loadtest.workloads.core import CodingAgent


@pytest.fixture
def twin() -> str:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "sim-backend", "--profile", "tiny", "--port", str(port), "--model", "m"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, "twin exited"
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "twin not ready"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
async def test_conversations_resend_history_and_hit_the_twin_cache(twin: str) -> None:
    cfg = LiveConfig(
        base_urls=[twin], model="m", conversations=2, duration_s=4.0, scale=0.032, think_scale=0.05, system="twin"
    )
    state = LevelState(2)
    row = await run_level(cfg, state)
    done = [r for r in state.records if r.finish is not None and r.ok]
    assert len(done) >= 6, row
    assert row["errors"] == 0 and row["starved"] == 0
    plan = CodingAgent(seed=1, scale=0.032).conversation(0, 0)
    mine = [r for r in done if r.slot == 0]
    # the usage chunk's output tokens are what the workload asked for
    assert [r.output_tokens for r in mine] == [t.output_tokens for t in plan.turns[: len(mine)]]
    # prompt tokens grow by the answer and the tool result (plus chat-template framing)
    grow = mine[1].prompt_tokens - mine[0].prompt_tokens
    assert grow >= plan.turns[0].output_tokens + plan.turns[1].new[0].tokens
    later = [r for r in done if r.cached_tokens > 0]
    assert len(later) >= len(done) - 2
    assert row["cache_hit_rate"] > 0.6
    assert all(r.first_token is not None and r.arrival < r.first_token <= r.finish for r in done)
    assert row["total_tpm"] == pytest.approx(row["input_tpm"] + row["output_tpm"], abs=1)


async def test_stop_keeps_partial_results(twin: str) -> None:
    cfg = LiveConfig(base_urls=[twin, twin], model="m", conversations=3, duration_s=30.0, scale=0.032, think_scale=0.05)
    stop = asyncio.Event()
    state = LevelState(3)
    asyncio.get_running_loop().call_later(1.5, stop.set)
    t = time.monotonic()
    row = await run_level(cfg, state, stop)
    assert time.monotonic() - t < 5
    assert row["interrupted"] and row["requests"] >= 3 and row["duration_s"] < 5


def test_loadtest_cli_sweep_json_and_report(twin: str, tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    res = CliRunner().invoke(
        app,
        [
            "loadtest",
            "--base-url",
            twin,
            "--model",
            "m",
            "--conversations",
            "1,2",
            "--duration",
            "2",
            "--scale",
            "0.032",
            "--think-scale",
            "0.05",
            "--teams",
            "a:1:key-a,b:1",
            "--json",
            str(out),
            "--report",
            str(tmp_path / "rep"),
            "--system",
            "twin",
        ],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 1  # teams fix the concurrency: one level
    assert runs[0]["conversations"] == 2 and set(runs[0]["teams"]) == {"a", "b"}
    assert runs[0]["completed_rpm"] > 0 and runs[0]["system"] == "twin"
    assert (tmp_path / "rep" / "index.html").exists() and "Total tok/min" in res.output


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path) -> None:
    """The sweep's logic on a very short run: both systems side by side at every level, on their own
    twins, a verdict, the plots, and no process left behind."""
    out = tmp_path / "report"
    t = time.monotonic()
    index = run_demo(
        DemoConfig(
            report=out,
            levels=[2, 4],
            duration_s=5.0,
            warmup_s=1.0,
            backends=1,
            profile="tiny",
            show_progress=False,
            fullscale=False,
        )
    )
    assert time.monotonic() - t < 90
    report = json.loads((out / "report.json").read_text())
    systems = {(r["system"], r["conversations"]) for r in report["runs"]}
    assert systems == {("gateway", 2), ("gateway", 4), ("direct", 2), ("direct", 4)}
    assert all(r["completed_rpm"] > 0 for r in report["runs"])
    # Each system ran on its own twin: direct's rows name the twin, gateway's the gateway.
    direct_urls = {u for r in report["runs"] if r["system"] == "direct" for u in r["base_urls"]}
    gateway_urls = {u for r in report["runs"] if r["system"] == "gateway" for u in r["base_urls"]}
    assert len(direct_urls) == 1 and len(gateway_urls) == 2 and not direct_urls & gateway_urls  # restarted per level
    assert report["verdict"]["conversations"] == 4 and "conversations" in report["verdict"]["sentence"]
    for name in ("live.png", "tpm.png", "ttft.png", "cache_hit.png"):
        assert (out / name).stat().st_size > 1000 and name in index.read_text()
    names = [p["name"] for p in report["processes"]]
    assert names.count("gateway") == 2 and "direct-twin0" in names and "gateway-twin0" in names
    for p in report["processes"]:
        assert p["returncode"] is not None
        with pytest.raises(ProcessLookupError):
            os.kill(p["pid"], 0)
