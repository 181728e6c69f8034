"""The request path in-process (httpx.ASGITransport), over the scripted upstream on loopback."""

from __future__ import annotations

import pytest

from tests.fake_upstream import SERVED, FakeUpstream
from tests.gateway.asgi import config, running

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


async def test_a_chat_stream_is_relayed_byte_for_byte_without_the_usage_it_asked_for(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (_, client):
        response = await client.post(CHAT, json={"model": "kimi", "stream": True, "messages": HI})
    assert response.status_code == 200 and response.headers["x-request-id"].startswith("cg-")
    assert upstream.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    assert response.content == b"".join(e for e in upstream.sent if b'"choices":[]' not in e)


async def test_a_completion_is_rewritten_for_upstream_and_its_usage_counted(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (_, client):
        response = await client.post("/v1/completions", json={"model": "kimi", "prompt": "say hi", "max_tokens": 5})
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200 and response.json()["usage"]["prompt_tokens"] == 11
    sent = upstream.requests[-1]
    assert sent["path"] == "/v1/completions" and sent["body"]["model"] == SERVED
    assert 'cachegate_tokens_total{kind="input",model="kimi",team="default"} 11.0' in metrics


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "nope", "messages": HI}, 404, "model_not_found"),
        ({"model": "kimi"}, 400, "invalid_request"),
        ({"model": "kimi", "messages": [{"role": "user", "content": "x" * 5000}]}, 413, "request_too_large"),
    ],
)
async def test_bad_requests_get_the_openai_envelope(
    upstream: FakeUpstream, body: dict[str, object], status: int, code: str
) -> None:
    async with running(config(upstream.url, max_body_bytes=4096)) as (_, client):
        response = await client.post(CHAT, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and set(error) == {"message", "type", "param", "code"}


async def test_a_dead_backend_is_retried_elsewhere_once(upstream: FakeUpstream) -> None:
    dead = FakeUpstream()
    with dead.running():
        async with running(config(dead.url, upstream.url, policy="round-robin")) as (_, client):
            dead.stop()
            served = len(upstream.requests)
            for _ in range(4):
                response = await client.post(CHAT, json={"model": "kimi", "messages": HI})
                assert response.status_code == 200
            metrics = (await client.get("/metrics")).text
    assert len(upstream.requests) == served + 4
    assert f'cachegate_upstream_errors_total{{backend="127.0.0.1:{dead.port}",kind="connect"}} 1.0' in metrics
    assert 'reason="retry"' in metrics


async def test_an_upstream_error_passes_through_and_the_seat_is_given_back(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (app, client):
        upstream.error_status = 400
        try:
            response = await client.post(CHAT, json={"model": "kimi", "messages": HI})
        finally:
            upstream.error_status = None
        assert response.status_code == 400 and response.json()["error"]["message"] == "scripted failure"
        core = app.state.gateway.core
        assert core.running == {} and all(s.busy == 0 for s in core.seats.values())


def test_request_ids_are_random_and_unique_across_refills() -> None:
    from gateway.request.lifecycle import request_id

    ids = [request_id() for _ in range(600)]  # more than one 4 KiB draw (256 ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 35 and i.startswith("cg-") and int(i[3:], 16) >= 0 for i in ids)
