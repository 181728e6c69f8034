"""Tests a newcomer can find: every runtime module of ``gateway/``, ``policies/`` and ``backends/``
has a test module of its own at the mirrored path (``gateway/http/wire.py`` →
``tests/gateway/http/test_wire.py``), except the thin wiring listed below with why. The behaviour
suites (``tests/gateway/test_request_path.py``, ``tests/live/``, ...) stay beside them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "policies", "backends")

WIRING: dict[str, str] = {
    "policies/types.py": "data only (frozen dataclasses, aliases, RefusalCode); its one function, new_dispatch, is "
    "tests/policies/test_contract.py's",
    "backends/sim/profile_fit.py": "the fitted profile's constants only; their use is tests/backends/"
    "test_engine_options.py's (the fitted profile says what is fitted) and test_engine_replicas.py's",
}
"""Modules with no behaviour of their own to test apart: what guards them instead."""


def _runtime_modules() -> list[Path]:
    return sorted(
        p.relative_to(ROOT) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p.name != "__init__.py"
    )


def _test_module(module: Path) -> Path:
    return Path("tests", *module.parts[:-1], f"test_{module.stem}.py")


def test_every_runtime_module_has_a_test_module_or_a_reason() -> None:
    missing = [str(m) for m in _runtime_modules() if not (ROOT / _test_module(m)).is_file() and str(m) not in WIRING]
    assert not missing, f"runtime modules with no test module at the mirrored path (or a WIRING reason): {missing}"


def test_the_exceptions_are_real_modules_without_a_test_module() -> None:
    modules = {str(m) for m in _runtime_modules()}
    stale = [m for m in WIRING if m not in modules or (ROOT / _test_module(Path(m))).is_file()]
    assert not stale, f"WIRING lists modules that are gone or have a test module now: {stale}"


def test_every_mirrored_directory_is_a_package() -> None:
    dirs = {(ROOT / _test_module(m)).parent for m in _runtime_modules() if (ROOT / _test_module(m)).is_file()}
    assert all((d / "__init__.py").is_file() for d in dirs), sorted(
        str(d) for d in dirs if not (d / "__init__.py").is_file()
    )
