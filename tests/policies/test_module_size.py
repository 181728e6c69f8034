"""Small modules with one job each: no Python module of the repository (the service, the load-test tools,
the tests, the deploy generators) is over 400 lines (the acceptance; a longer one is split by job, not trimmed)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "policies", "backends", "loadtest", "tests", "deploy")
LIMIT = 400


def _lengths() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_the_scan_sees_every_package() -> None:
    found = {name.split("/")[0] for name in _lengths()}
    assert found == set(PACKAGES)
    assert _lengths()["policies/admission/core.py"] > 0


def test_no_module_is_over_400_lines() -> None:
    over = {name: n for name, n in _lengths().items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them by job): {over}"
