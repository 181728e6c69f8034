"""The service without the load-test tools: what the container image and a bare ``pip install .`` hold.

A child interpreter refuses every import of ``loadtest`` and ``matplotlib`` (a meta-path finder that
raises ``ModuleNotFoundError`` for them, as a missing package does); the service still builds its app
and its CLI still offers ``serve`` and ``sim-backend``, without the tools' commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = """
import importlib.abc, sys
class _Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("loadtest", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Missing())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_blocker_blocks() -> None:
    done = _run("import loadtest.cli")
    assert done.returncode != 0 and "No module named 'loadtest" in done.stderr


def test_the_service_builds_without_the_tools() -> None:
    done = _run(
        "from gateway.config.schema import load_config\n"
        "from gateway.app import create_app\n"
        "cfg = load_config(None, backends=['http://127.0.0.1:9'], model='m')\n"
        "create_app(cfg)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('loadtest', 'matplotlib')]\n"
        "print('ok')\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_cli_offers_serve_without_the_tools() -> None:
    done = _run(
        "from typer.main import get_command\n"
        "from gateway.cli import app\n"
        "print(' '.join(sorted(get_command(app).commands)))\n"  # type: ignore[attr-defined]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["serve", "sim-backend"]


def test_the_cli_offers_the_tools_where_they_are_installed() -> None:
    from typer.main import get_command

    from gateway.cli import app

    commands = set(get_command(app).commands)  # type: ignore[attr-defined]
    assert {"serve", "sim-backend", "simulate", "demo", "plan", "compare", "loadtest", "bench", "chaos"} <= commands
