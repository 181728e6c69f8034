"""gateway/app.py: which route goes where (the surfaces' POSTs handed to their request path, the second
paths, the probes, the errors of routing in OpenAI's envelope), the middleware order (the overload guard
before every surface), the lifespan (start, the metrics port, stop, surfaces closed) and the factory
``--workers N`` uses. The app runs in-process (tests/gateway/asgi.py) over tests/fake_upstream.py."""

from __future__ import annotations

import httpx
import pytest
from asgi_lifespan import LifespanManager

from gateway.app import app_from_env, create_app, default_surfaces
from gateway.surfaces.base import ClientRequest, Target, UpstreamCall
from gateway.surfaces.chat import CHAT, COMPLETIONS, OpenAISurface
from gateway.surfaces.messages import MessagesSurface
from gateway.surfaces.responses import ResponsesSurface
from gateway.worker import Gateway
from tests.fake_upstream import FakeUpstream, free_port
from tests.gateway.asgi import config, running

HI = [{"role": "user", "content": "hi"}]


def test_default_surfaces_are_every_client_api_with_fresh_stateful_ones() -> None:
    first, second = default_surfaces(), default_surfaces()
    assert [s.path for s in first] == ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
    assert first[0] is CHAT and first[1] is COMPLETIONS
    assert isinstance(first[2], ResponsesSurface) and first[2] is not second[2], "the store is per app"
    assert isinstance(first[3], MessagesSurface) and first[3] is not second[3]


async def test_the_probes_answer(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (_, client):
        health = await client.get("/healthz")
        ready = await client.get("/readyz")
        metrics = await client.get("/metrics")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    backend = ready.json()["backends"][f"127.0.0.1:{upstream.port}"]
    assert backend == {"healthy": True, "model": "kimi", "error": None}
    assert ready.json()["state"]["mode"] == "memory"
    assert metrics.status_code == 200 and "cachegate_requests_total" in metrics.text


async def test_readyz_is_503_without_a_healthy_backend_and_hides_details_when_keys_are_required() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = config(dead, endpoints={"require_key": True})
    async with running(cfg, admin_token="adm") as (_, client):
        anonymous = await client.get("/readyz")
        admin = await client.get("/readyz", headers={"authorization": "Bearer adm"})
        metrics = await client.get("/metrics")
    assert anonymous.status_code == 503 and anonymous.json() == {"status": "not ready"}
    assert admin.status_code == 503 and admin.json()["backends"][dead.removeprefix("http://")]["healthy"] is False
    assert metrics.status_code == 401 and metrics.json()["error"]["code"] == "missing_api_key"


async def test_routing_errors_are_in_openais_envelope(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (_, client):
        unknown = await client.get("/v2/nothing")
        wrong_method = await client.get("/v1/chat/completions")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    assert "GET /v2/nothing" in unknown.json()["error"]["message"]
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


async def test_each_surface_path_and_its_second_path_run_the_request_path(upstream: FakeUpstream) -> None:
    bodies = {
        "/v1/chat/completions": {"model": "kimi", "messages": HI},
        "/v1/completions": {"model": "kimi", "prompt": "hi"},
        "/v1/messages": {"model": "kimi", "max_tokens": 5, "messages": HI},
        "/messages": {"model": "kimi", "max_tokens": 5, "messages": HI},
    }
    async with running(config(upstream.url)) as (_, client):
        for path, body in bodies.items():
            served = len(upstream.requests)
            response = await client.post(path, json=body)
            assert response.status_code == 200, path
            assert response.headers["x-request-id"].startswith("cg-"), path
            assert len(upstream.requests) == served + 1, path
        anthropic = await client.post("/messages", json={"model": "nope", "max_tokens": 5, "messages": HI})
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error", "the Messages surface's envelope"


async def test_the_overload_guard_sheds_every_surface_in_its_own_envelope(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, client):
        gw = app.state.gateway
        gw.overload.avg_lag_s = 10.0  # the loop far behind
        try:
            chat = await client.post("/v1/chat/completions", json={"model": "kimi", "messages": HI})
            alias = await client.post("/messages", json={"model": "kimi", "max_tokens": 5, "messages": HI})
            health = await client.get("/healthz")
        finally:
            gw.overload.avg_lag_s = 0.0
        metrics = (await client.get("/metrics")).text
    assert chat.status_code == 503 and chat.json()["error"]["code"] == "overloaded"
    assert alias.status_code == 503 and alias.json()["error"]["type"] == "overloaded_error"
    assert health.status_code == 200, "only new requests on the surfaces are shed"
    assert 'cachegate_admission_refusals_total{reason="overloaded",team="default"} 2.0' in metrics


class Recorded(OpenAISurface):
    """A chat surface on its own path that records being bound and closed."""

    def __init__(self) -> None:
        super().__init__("chat")
        self.name, self.path = "recorded", "/v1/recorded"
        self.bound: object = None
        self.closed = 0

    def bind(self, gateway: object) -> None:
        self.bound = gateway

    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        call = super().upstream(req, target)
        call.path = "/v1/chat/completions"  # served by the backends' chat API
        return call

    async def close(self) -> None:
        self.closed += 1


async def test_given_surfaces_are_bound_served_closed_and_a_response_store_is_added(upstream: FakeUpstream) -> None:
    surface = Recorded()
    app = create_app(config(upstream.url), surfaces=[surface])
    assert isinstance(surface.bound, Gateway) and surface.bound is app.state.gateway
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            mine = await client.post("/v1/recorded", json={"model": "kimi", "messages": HI})
            chat = await client.post("/v1/chat/completions", json={"model": "kimi", "messages": HI})
            stored = await client.get("/v1/responses/resp_unknown")
        assert surface.closed == 0
    assert surface.closed == 1, "the lifespan's end closes every surface"
    assert mine.status_code == 200 and mine.json()["choices"][0]["message"]["content"] == "Hello, world!"
    assert chat.status_code == 404 and chat.json()["error"]["code"] == "unknown_url", "only the surfaces given"
    assert stored.status_code == 404 and stored.json()["error"]["code"] != "unknown_url", "the store answers"


async def test_the_lifespan_serves_the_metrics_port_and_stops_it(upstream: FakeUpstream) -> None:
    port = free_port()
    async with running(config(upstream.url, endpoints={"metrics_port": port})) as (app, client):
        main = await client.get("/metrics")
        async with httpx.AsyncClient() as outside:
            own = await outside.get(f"http://127.0.0.1:{port}/metrics")
        assert app.state.gateway.upstream is not None, "the worker started"
    assert main.status_code == 404 and str(port) in main.json()["error"]["message"]
    assert own.status_code == 200 and "cachegate_requests_total" in own.text
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as outside:
            await outside.get(f"http://127.0.0.1:{port}/metrics")


def test_the_workers_factory_rebuilds_the_app_from_the_serialised_config(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config("http://127.0.0.1:1", policy="direct", max_body_bytes=4096)
    monkeypatch.setenv("CACHEGATE_CONFIG_JSON", cfg.model_dump_json())
    app = app_from_env()
    gw = app.state.gateway
    assert isinstance(gw, Gateway)
    assert gw.config == cfg and gw.config.max_body_bytes == 4096 and gw.config.policy == "direct"
    gw.metrics.close()
