"""backends/sim/serve.py: the uvicorn configuration a twin runs under (SGLang's loop and parser when
installed, keep-alive, lifespan, TLS), and ``serve`` refusing a bad setting before it binds. A served
twin: backends/sim/testing.py's ``run_twin`` (tests/backends/sim/test_testing.py) and ``spawn_twin``."""

from __future__ import annotations

import importlib.util

import pytest

from backends.sim.serve import serve, uvicorn_config
from backends.sim.server import create_app


def test_the_config_serves_the_app_as_sglang_does() -> None:
    app = create_app("tiny")
    cfg = uvicorn_config(app, "0.0.0.0", 30001, log_level="info")
    assert cfg.app is app and (cfg.host, cfg.port, cfg.log_level) == ("0.0.0.0", 30001, "info")
    assert cfg.timeout_keep_alive == 5 and cfg.access_log is False and cfg.lifespan == "on"
    assert cfg.loop == ("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")
    assert cfg.http == ("httptools" if importlib.util.find_spec("httptools") else "h11")
    assert cfg.ssl_certfile is None and cfg.ssl_keyfile is None


def test_tls_names_the_certificate_chain_and_key() -> None:
    cfg = uvicorn_config(create_app("tiny"), "127.0.0.1", 8443, tls=("/etc/chain.pem", "/etc/key.pem"))
    assert (cfg.ssl_certfile, cfg.ssl_keyfile) == ("/etc/chain.pem", "/etc/key.pem")


def test_serve_refuses_a_bad_setting_before_it_binds() -> None:
    with pytest.raises(ValueError, match="unknown route set"):
        serve("tiny", port=1, routes="bogus")  # port 1 would fail to bind: it never gets there
    with pytest.raises(ValueError, match="unknown profile"):
        serve("no-such-profile", port=1)
