"""backends/sim/cli.py: ``cachegate sim-backend``'s own checks and help, in-process (typer's runner): bad
values end with exit code 2 and one line naming the problem, before any server starts. A real
``sim-backend`` process with its flags: tests/backends/test_twin_api.py::test_sim_backend_process."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from backends.sim.cli import HELP, sim_backend

APP = typer.Typer()
APP.command()(sim_backend)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time-scale", "0"], "--time-scale and --scale must be > 0"),
        (["--scale", "-1"], "--time-scale and --scale must be > 0"),
        (["--routes", "bogus"], "unknown route set 'bogus'; choose one of: all, responses, chat"),
        (["--engine", "trt"], "unknown engine 'trt'"),
        (["--profile", "h100-nope"], "unknown profile 'h100-nope'"),
        (["--disaggregation-mode", "both"], "null, prefill or decode, got 'both'"),
        (["--kv-events-config", '{"publisher": "kafka"}'], "Unknown event publisher 'kafka'"),
    ],
)
def test_a_bad_value_exits_2_with_one_line_before_serving(args: list[str], message: str) -> None:
    result = CliRunner().invoke(APP, args)
    assert result.exit_code == 2
    assert result.stderr.startswith("cachegate sim-backend: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_the_help_explains_how_the_twin_answers() -> None:
    assert sim_backend.__doc__ == HELP
    assert HELP.startswith("Run a simulated SGLang server")
    for paragraph in (
        "Tools: when a request offers tools",
        "Length: answers are log-uniform",
        "Context: every profile",
        "Disaggregated (--disaggregation-mode prefill|decode)",
    ):
        assert f"\n\n{paragraph}" in HELP
    result = CliRunner().invoke(APP, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in (
        "--profile",
        "--time-scale",
        "--cache-report",
        "--no-cache-report",
        "--engine",
        "--kv-events-config",
        "--disaggregation-bootstrap-port",
    ):
        assert option in result.output
