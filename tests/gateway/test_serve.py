"""gateway/serve.py: what ``run`` refuses before it starts uvicorn (several workers without Redis, no
model), the open-files limit raised to its hard limit, and the accept backlog's kernel cap said at
start. uvicorn serving the app (one worker or several) runs end to end in every suite that starts
``cachegate serve`` (tests/harness.py; several workers: tests/live/test_workers.py)."""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config.schema import Config
from gateway.http.gcpause import ENV as QUIET_GC
from gateway.http.server import ENV as LIMITS_ENV
from gateway.serve import _check_backlog, _raise_open_files, run
from tests.gateway.asgi import config


@pytest.fixture(autouse=True)
def untouched_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What ``run`` would set for the workers stays unset when it refuses to start."""
    for name in ("CACHEGATE_CONFIG_JSON", LIMITS_ENV, QUIET_GC):
        monkeypatch.delenv(name, raising=False)
    httpx_level = logging.getLogger("httpx").level  # run's logging set-up changes it
    before = _env()
    yield
    assert _env() == before
    logging.getLogger("httpx").setLevel(httpx_level)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def test_several_workers_need_redis() -> None:
    with pytest.raises(SystemExit) as stopped:
        run(config("http://127.0.0.1:9", workers=2))
    assert "--workers N > 1 needs Redis" in str(stopped.value.code)


def test_there_must_be_a_model() -> None:
    with pytest.raises(SystemExit) as stopped:
        run(Config.model_validate({}))
    assert "no models configured" in str(stopped.value.code)


@pytest.fixture()
def restored_nofile() -> Iterator[tuple[int, int]]:
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield limits
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_the_open_files_limit_is_raised_to_the_hard_limit(restored_nofile: tuple[int, int]) -> None:
    _, hard = restored_nofile
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-files limit ({hard}) leaves no room to lower the soft one")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    _raise_open_files()
    expected = 65536 if hard == resource.RLIM_INFINITY else hard
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)
    _raise_open_files()  # already there: nothing changes
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (expected, hard)


def _somaxconn() -> int:
    path = Path("/proc/sys/net/core/somaxconn")
    if not path.is_file():
        pytest.skip("no /proc/sys/net/core/somaxconn here")
    return int(path.read_text())


def test_a_backlog_past_the_kernels_cap_is_said_once_at_start(caplog: pytest.LogCaptureFixture) -> None:
    cap = _somaxconn()
    with caplog.at_level(logging.INFO, logger="cachegate"):
        _check_backlog(cap)
        assert caplog.records == [], "within the cap: nothing to say"
        _check_backlog(cap + 1)
    assert [r.getMessage() for r in caplog.records] == [
        f"accept backlog {cap + 1} is capped at net.core.somaxconn = {cap} by the kernel"
    ]
