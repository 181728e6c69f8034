"""Who may read the gateway's own endpoints (gateway/observability/exposure.py): ``may_see`` and
``guard`` against a real ``Gateway``'s keys and admin token, and ``/metrics`` on a port of its own
(``MetricsServer``: prometheus-client's app behind the same rule, on a uvicorn server in this event
loop, its socket shared by every worker). The served gateway's endpoints over real sockets:
tests/gateway/test_http_limits.py::test_closed_endpoints_and_the_metrics_port."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from gateway.config.schema import Config, hash_key
from gateway.http.errors import GatewayError
from gateway.observability.exposure import MetricsServer, guard, may_see
from gateway.worker import Gateway
from tests.fake_upstream import free_port

ADMIN = "admin-secret"


def gateway(keys: bool = True, **endpoints: Any) -> Gateway:
    config = Config.model_validate(
        {
            "models": {"m": {"backends": [{"url": "http://127.0.0.1:9"}]}},
            "keys": [{"sha256": hash_key("team-key"), "team": "a"}] if keys else [],
            "endpoints": endpoints,
        }
    )
    return Gateway(config, admin_token=ADMIN)


def request(**headers: str) -> Request:
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/metrics", "headers": raw})


def test_open_endpoints_show_everyone_everything() -> None:
    gw = gateway(require_key=False)
    assert may_see(gw, request()) and may_see(gw, request(authorization="Bearer wrong"))
    guard(gw, request(), metrics=True)  # nothing raised


def test_closed_endpoints_need_a_team_key_or_the_admin_token() -> None:
    gw = gateway(require_key=True)
    assert may_see(gw, request(authorization="Bearer team-key"))
    assert may_see(gw, request(x_api_key="team-key"))
    assert may_see(gw, request(authorization=f"Bearer {ADMIN}"))
    assert not may_see(gw, request())
    assert not may_see(gw, request(authorization="Bearer wrong"))
    with pytest.raises(GatewayError) as info:
        guard(gw, request())
    assert (info.value.status, info.value.code) == (401, "missing_api_key")
    guard(gw, request(authorization="Bearer team-key"))


def test_without_team_keys_only_the_admin_token_opens_a_closed_endpoint() -> None:
    gw = gateway(keys=False, require_key=True)
    assert not may_see(gw, request()) and not may_see(gw, request(authorization="Bearer anything"))
    assert may_see(gw, request(authorization=f"Bearer {ADMIN}"))


def test_metrics_on_their_own_port_are_not_on_the_main_one() -> None:
    gw = gateway(require_key=False, metrics_port=9464)
    with pytest.raises(GatewayError) as info:
        guard(gw, request(authorization=f"Bearer {ADMIN}"), metrics=True)
    assert (info.value.status, info.value.code) == (404, "unknown_url") and "9464" in info.value.message
    guard(gw, request())  # the other guarded endpoints stay where they are


async def test_the_metrics_port_serves_metrics_behind_the_key_rule() -> None:
    port = free_port()
    gw = gateway(require_key=True, metrics_port=port)
    gw.metrics.requests.labels("a", "m", "b", "200").inc()
    servers = [MetricsServer(gw), MetricsServer(gw)]  # two workers bind the same port (SO_REUSEPORT)
    try:
        for server in servers:
            await server.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            denied = await client.get("/metrics")
            assert denied.status_code == 401 and "needs an API key" in denied.text
            ok = await client.get("/metrics", headers={"authorization": "Bearer team-key"})
            assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
            assert 'cachegate_requests_total{backend="b",model="m",status="200",team="a"} 1.0' in ok.text
            om = await client.get(
                "/metrics", headers={"x-api-key": "team-key", "accept": "application/openmetrics-text"}
            )
            assert om.headers["content-type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
            assert (await client.get("/v1/models", headers={"x-api-key": "team-key"})).status_code == 404
            assert (await client.post("/metrics", headers={"x-api-key": "team-key"})).status_code == 405
    finally:
        for server in servers:
            await server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1)


async def test_no_metrics_port_no_server_and_a_taken_port_fails_the_start() -> None:
    idle = MetricsServer(gateway())
    await idle.start()
    await idle.stop()
    assert idle.server is None and idle.task is None
    with socket.socket() as taken:  # a socket without SO_REUSEPORT holds the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = MetricsServer(gateway(metrics_port=taken.getsockname()[1]))
        with pytest.raises(OSError):
            await server.start()
        await server.stop()
