"""gateway/cli.py: the ``cachegate`` command's own behaviour, in-process through typer's runner: which
commands exist (the load-test tools only where ``loadtest`` is installed), ``serve`` turning a bad
configuration into exit code 2 and handing the admin token to the workers' environment, and the
arguments ``bench`` and ``chaos`` pass on or refuse. Serving itself is ``gateway/serve.py``'s, run end to
end by every suite that starts ``cachegate serve`` (tests/harness.py)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import gateway.cli as cli

SERVICE = ["sim-backend", "serve"]
TOOLS = ["simulate", "loadtest", "demo", "plan", "compare", "bench", "chaos"]


@pytest.fixture()
def runner() -> Iterator[CliRunner]:
    httpx_level = logging.getLogger("httpx").level  # serve's logging set-up changes it
    yield CliRunner()
    logging.getLogger("httpx").setLevel(httpx_level)


def commands(app: object) -> list[str]:
    return [c.name for c in app.registered_commands]  # type: ignore[attr-defined]


def test_every_command_is_there_where_loadtest_is_installed(runner: CliRunner) -> None:
    assert commands(cli.app) == SERVICE + TOOLS
    shown = runner.invoke(cli.app, [])
    assert all(name in shown.output for name in SERVICE + TOOLS), "no arguments: the help"


class Hidden:
    """A meta path finder for which the packages ``names`` are not installed."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_without_loadtest_only_the_service_commands_remain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "meta_path", [Hidden("loadtest"), *sys.meta_path])  # as in the service's image
    for name in [m for m in sys.modules if m == "loadtest" or m.startswith("loadtest.")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        assert commands(importlib.reload(cli).app) == SERVICE
    finally:
        monkeypatch.undo()
        importlib.reload(cli)
    assert commands(cli.app) == SERVICE + TOOLS


def test_a_tools_own_missing_dependency_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "loadtest.compare_cli", None)  # loadtest is there, a tool's part is not
    try:
        with pytest.raises(ModuleNotFoundError):
            importlib.reload(cli)
    finally:
        monkeypatch.undo()
        importlib.reload(cli)
    assert commands(cli.app) == SERVICE + TOOLS


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--backend", "http://127.0.0.1:9"], "--backend needs --model"),
        (["--config", "/nonexistent/cachegate.yaml"], "No such file"),
        (["--backend", "http://127.0.0.1:9", "--model", "m", "--api-key", "=team"], "non-empty key"),
        (["--backend", "http://127.0.0.1:9", "--model", "m", "--policy", "no-such-policy"], "policy"),
    ],
    ids=["backend-without-model", "missing-file", "empty-key", "unknown-policy"],
)
def test_serve_refuses_a_bad_configuration_with_exit_code_2(runner: CliRunner, args: list[str], reason: str) -> None:
    result = runner.invoke(cli.app, ["serve", *args])
    assert result.exit_code == 2, result.output
    assert "cachegate: invalid configuration:" in result.output and reason in result.output


def test_serve_hands_the_admin_token_to_the_workers_environment(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CACHEGATE_ADMIN_TOKEN", "before")
    monkeypatch.delenv("CACHEGATE_REDIS_URL", raising=False)
    # two workers without Redis: serve.run stops before starting uvicorn, after the token is set
    args = ["serve", "--backend", "http://127.0.0.1:9", "--model", "m", "--workers", "2", "--admin-token", "tok"]
    result = runner.invoke(cli.app, args)
    assert result.exit_code == 1 and "needs Redis" in result.output
    assert os.environ["CACHEGATE_ADMIN_TOKEN"] == "tok"


def test_bench_passes_every_argument_on_to_the_relay_benchmark(runner: CliRunner) -> None:
    result = runner.invoke(cli.app, ["bench", "--help"])
    assert result.exit_code == 0 and "usage: cachegate bench" in result.output and "--streams" in result.output
    refused = runner.invoke(cli.app, ["bench", "--no-such-option"])
    assert refused.exit_code == 2 and "unrecognized arguments: --no-such-option" in refused.output


def test_chaos_refuses_an_unknown_mode(runner: CliRunner) -> None:
    result = runner.invoke(cli.app, ["chaos", "storm"])
    assert result.exit_code == 2 and "mode must be faults, soak, slow or hol" in result.output
