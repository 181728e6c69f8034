"""Overload fails safe on every client surface, not just chat: a worker that is behind sheds new
requests on /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages and /messages with
503 ``overloaded`` + ``Retry-After`` in that surface's envelope; other routes are not shed; and a
full upstream connection budget refuses a translated request the same way without blaming the
backend, while the stream that holds the connection completes."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tests.fake_upstream import FakeUpstream
from tests.gateway.asgi import config, running

HI = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"model": "kimi", "stream": True, "messages": HI},
    "/v1/completions": {"model": "kimi", "prompt": "hi"},
    "/v1/responses": {"model": "kimi", "input": "hi", "stream": True},
    "/v1/messages": {"model": "kimi", "max_tokens": 20, "stream": True, "messages": HI},
    "/messages": {"model": "kimi", "max_tokens": 20, "messages": HI},
}


def _overloaded(path: str, status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 503 and int(headers["retry-after"]) >= 1
    payload = orjson.loads(body)
    if path.endswith("/messages"):  # Anthropic's envelope has no code field: it goes in a header
        assert payload["type"] == "error" and payload["error"]["type"] == "overloaded_error"
        assert headers["x-cachegate-code"] == "overloaded"
    else:
        assert payload["error"]["code"] == "overloaded" and payload["error"]["type"]


async def test_a_worker_behind_sheds_every_surface_in_its_envelope(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, client):
        ov = app.state.gateway.overload
        ov.avg_lag_s = 10.0  # as if the loop had been 10 s late on average
        await ov.stop()  # and stays so: the monitor would measure the (idle) test loop catching up
        for path, body in BODIES.items():
            response = await client.post(path, json=body)
            _overloaded(path, response.status_code, dict(response.headers), response.content)
        assert (await client.get("/v1/models")).status_code == 200, "only the surfaces' POSTs are shed"
        cancel = await client.post("/v1/responses/resp_nope/cancel")
        assert cancel.status_code == 404, "a response's cancel is not a new request"
        assert (await client.get("/v1/messages")).status_code == 405
        metrics = (await client.get("/metrics")).text
        shed = ov.shed
        ov.avg_lag_s = 0.0
        served = await client.post("/v1/messages", json=BODIES["/messages"])
    assert shed == len(BODIES)
    assert 'cachegate_admission_refusals_total{reason="overloaded",team="default"} 5.0' in metrics
    # the access log's per-route count saw every answer, the shed ones and a wrong method alike
    assert 'cachegate_http_requests_total{method="POST",route="/messages",status="503"} 1.0' in metrics
    assert 'cachegate_http_requests_total{method="GET",route="/v1/messages",status="405"} 1.0' in metrics
    assert served.status_code == 200 and served.json()["type"] == "message", "caught up: served again"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
async def test_a_full_connection_budget_refuses_a_translated_request_and_blames_nobody(path: str) -> None:
    up = FakeUpstream(chunk_delay_s=0.1)
    with up.running():
        cfg = config(up.url, upstream={"max_connections": 1, "connect_timeout_s": 0.3})
        async with running(cfg) as (app, client):
            first = asyncio.create_task(client.post(path, json=BODIES[path]))
            while not any(c.streaming for c in up.connections):  # the first stream holds the one connection
                await asyncio.sleep(0.01)
            second = await client.post(path, json=BODIES[path])
            held = await first
            backend = app.state.gateway.pool.all()[0]
            healthy, breaker = backend.healthy, backend.breaker_state
            metrics = (await client.get("/metrics")).text
    _overloaded(path, second.status_code, dict(second.headers), second.content)
    assert held.status_code == 200 and b"event: error" not in held.content, "the admitted stream completes"
    done = b"message_stop" if path == "/v1/messages" else b"response.completed"
    assert done in held.content
    assert healthy and breaker == 0, "the backend was not blamed for the gateway's own budget"
    assert 'reason="overloaded"' in metrics
    errors = [ln for ln in metrics.splitlines() if ln.startswith("cachegate_upstream_errors_total{")]
    assert all(ln.endswith(" 0.0") for ln in errors), errors
