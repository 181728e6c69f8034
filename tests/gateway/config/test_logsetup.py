"""The process's log lines (gateway/config/logsetup.py): the layout and level ``cachegate serve`` and
each of its workers set on a root logger that has no handler yet, and httpx's per-request lines kept out."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

import pytest

from gateway.config.logsetup import configure_logging
from gateway.config.schema import Config

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<name>[\w.]+): (?P<message>.*)$")


@contextlib.contextmanager
def bare_root() -> Iterator[logging.Logger]:
    """The root logger as a fresh process has it (no handler; pytest adds its own to each test phase),
    restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    httpx_level = logging.getLogger("httpx").level
    root.handlers = []
    try:
        yield root
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers = handlers
        root.setLevel(level)
        logging.getLogger("httpx").setLevel(httpx_level)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, str]]:
    out = []
    for line in capsys.readouterr().err.splitlines():
        match = LINE.match(line)
        assert match, f"not in the log layout: {line!r}"
        out.append(match.groupdict())
    return out


def test_lines_carry_time_level_and_logger_name(capsys: pytest.CaptureFixture[str]) -> None:
    with bare_root():
        configure_logging(Config(log_level="info"))
        logging.getLogger("cachegate.state").info("replica %s joined", "r1")
        logging.getLogger("cachegate").debug("not at info")
    assert _lines(capsys) == [{"level": "INFO", "name": "cachegate.state", "message": "replica r1 joined"}]


def test_the_configured_level_is_taken_whatever_its_case(capsys: pytest.CaptureFixture[str]) -> None:
    with bare_root() as root:
        configure_logging(Config(log_level="Warning"))
        assert root.level == logging.WARNING
        logging.getLogger("cachegate").info("dropped")
        logging.getLogger("cachegate").warning("kept")
    assert [line["message"] for line in _lines(capsys)] == ["kept"]


def test_httpx_says_only_warnings_even_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    with bare_root():
        configure_logging(Config(log_level="debug"))
        logging.getLogger("httpx").info("HTTP Request: GET http://backend/health 200 OK")
        logging.getLogger("httpx").warning("a warning")
        logging.getLogger("cachegate").debug("a debug line")
    assert [(line["name"], line["message"]) for line in _lines(capsys)] == [
        ("httpx", "a warning"),
        ("cachegate", "a debug line"),
    ]


def test_an_unknown_level_is_refused() -> None:
    with bare_root(), pytest.raises(ValueError, match="LOUD"):
        configure_logging(Config(log_level="loud"))
