"""The ``server:`` and ``endpoints:`` sections (gateway/config/server.py): their defaults, the bounds a
file must respect, and the ``server:`` limits reaching the HTTP protocol of every worker as
``gateway/serve.py`` hands them on (``CACHEGATE_SERVER_LIMITS``, read by gateway/http/server.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config.schema import Config
from gateway.config.server import EndpointsConfig, ServerConfig
from gateway.http import server as http_server
from gateway.http.server import ENV, Limits, limits


def test_the_protocols_limits_default_to_the_sections_defaults() -> None:
    """A worker started without the variable (an app run some other way) enforces what the config's
    defaults say: the two are declared apart, one in each layer."""
    shared = {f.name for f in dataclasses.fields(Limits)}
    assert shared < set(ServerConfig.model_fields)
    defaults = ServerConfig().model_dump()
    assert {name: defaults[name] for name in shared} == dataclasses.asdict(Limits())


def test_the_section_reaches_the_protocol_as_serve_hands_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    section = ServerConfig(header_timeout_s=2.5, body_timeout_s=30, max_header_bytes=8192, max_headers=50, backlog=64)
    monkeypatch.setenv(ENV, section.model_dump_json())  # what gateway/serve.py sets for its workers
    monkeypatch.setattr(http_server, "_limits", None)
    assert limits() == Limits(
        header_timeout_s=2.5, body_timeout_s=30.0, body_idle_timeout_s=15.0, max_header_bytes=8192, max_headers=50
    )


def test_server_defaults() -> None:
    server = ServerConfig()
    assert (server.keep_alive_s, server.limit_concurrency, server.backlog) == (75, None, 8192)
    assert Config().server == server and Config().endpoints == EndpointsConfig()


@pytest.mark.parametrize(
    "bad",
    [
        {"header_timeout_s": 0},
        {"body_timeout_s": -1},
        {"body_idle_timeout_s": 0},
        {"max_header_bytes": 1023},
        {"max_headers": 7},
        {"keep_alive_s": 0},
        {"limit_concurrency": 0},
        {"backlog": 0},
        {"header_timeout": 5},  # a misspelt field is refused, not ignored
    ],
)
def test_server_bounds(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ServerConfig.model_validate(bad)
    with pytest.raises(ValidationError, match="server"):
        Config.model_validate({"server": bad})


def test_the_smallest_allowed_server_limits_are_taken() -> None:
    server = ServerConfig.model_validate({"max_header_bytes": 1024, "max_headers": 8, "keep_alive_s": 1, "backlog": 1})
    assert (server.max_header_bytes, server.max_headers, server.keep_alive_s, server.backlog) == (1024, 8, 1, 1)


def test_endpoints_are_open_by_default_and_the_metrics_port_is_bounded() -> None:
    assert EndpointsConfig() == EndpointsConfig(require_key=False, metrics_port=None)
    assert EndpointsConfig(metrics_port=0).metrics_port == 0
    assert EndpointsConfig(metrics_port=65535).metrics_port == 65535
    for bad in ({"metrics_port": -1}, {"metrics_port": 65536}, {"require_keys": True}):
        with pytest.raises(ValidationError):
            EndpointsConfig.model_validate(bad)
    closed = Config.model_validate({"endpoints": {"require_key": True, "metrics_port": 9464}})
    assert closed.endpoints == EndpointsConfig(require_key=True, metrics_port=9464)
