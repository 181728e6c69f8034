"""A client surface plugs into the one request path as a parser, an upstream builder, a relay and an
error renderer, and gets everything else (auth, admission, routing, retries, release, metrics, access
log) without copying it. The surface here is a made-up API: ``POST /v1/shout`` takes ``text``, is
served by the backends' chat completions, answers in upper case with its own SSE events, and answers
errors in an Anthropic-style envelope with the cachegate code in a header."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from gateway.app import default_surfaces
from gateway.config.schema import hash_key
from gateway.http.errors import GatewayError
from gateway.surfaces.base import ClientRequest, ErrorReply, Surface, Target, TranslatingRelay, UpstreamCall
from tests.fake_upstream import SERVED, FakeUpstream
from tests.gateway.asgi import config, running

KEY, BLOCKED = "sk-ok", "sk-blocked"
AUTH = {"authorization": f"Bearer {KEY}"}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class ShoutRelay(TranslatingRelay):
    def __init__(self) -> None:
        self.events = 0

    def translate_event(self, event: bytes) -> bytes:
        if event.startswith(b":"):
            return _sse("ping", {})
        data = b"".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
        if data == b"[DONE]":
            return _sse("done", {"events": self.events})
        payload = orjson.loads(data)
        if "error" in payload:
            return _sse("error", {"message": payload["error"]["message"]})
        text = "".join((c.get("delta") or {}).get("content") or "" for c in payload.get("choices") or [])
        if not text:
            return b""  # role-only, finish and usage chunks
        self.events += 1
        return _sse("text", {"text": text.upper()})

    def translate_whole(self, status: int, payload: bytes, content_type: bytes) -> tuple[int, bytes, bytes]:
        if status != 200:
            return (
                status,
                orjson.dumps({"type": "error", "error": {"type": "api_error", "message": "upstream"}}),
                b"application/json",
            )
        text = orjson.loads(payload)["choices"][0]["message"]["content"]
        return 200, orjson.dumps({"text": text.upper()}), b"application/json"


class ShoutSurface(Surface):
    name = "shout"
    path = "/v1/shout"

    def __init__(self) -> None:
        self.targets: list[Target] = []

    def parse(self, raw: bytes) -> ClientRequest:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise GatewayError(400, "not JSON", "invalid_json") from None
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise GatewayError(400, "'text' is required", "invalid_request", "text")
        messages = [{"role": "user", "content": body["text"]}]
        return ClientRequest(
            model=str(body.get("model")),
            stream=bool(body.get("stream")),
            max_tokens=None,
            prompt={"messages": messages},
            body=body,
            native=messages,
        )

    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        self.targets.append(target)
        body: dict[str, Any] = {"model": target.upstream_model, "messages": req.native, "stream": req.stream}
        if req.stream:
            body["stream_options"] = {"include_usage": True}
        return UpstreamCall("/v1/chat/completions", orjson.dumps(body), ShoutRelay())

    def error(self, err: GatewayError) -> ErrorReply:
        kind = {429: "rate_limit_error", 404: "not_found_error", 400: "invalid_request_error"}.get(
            err.status, "api_error"
        )
        headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        return ErrorReply(
            err.status,
            orjson.dumps({"type": "error", "error": {"type": kind, "message": err.message}}),
            headers=[*headers, (b"x-cachegate-code", (err.code or "").encode())],
        )


def _config(url: str) -> Any:
    return config(
        url,
        keys=[{"sha256": hash_key(KEY), "team": "ok"}, {"sha256": hash_key(BLOCKED), "team": "no"}],
        teams={"ok": {"max_concurrency": 4}, "no": {"max_concurrency": 0, "max_queue": 0}},
    )


def _app(url: str, surface: ShoutSurface | None = None) -> Any:
    return running(_config(url), surfaces=[*default_surfaces(), surface or ShoutSurface()])


async def test_a_translated_stream_reports_first_token_and_usage(upstream: FakeUpstream) -> None:
    async with _app(upstream.url) as (_, client):
        response = await client.post(
            "/v1/shout",
            json={"model": "kimi", "text": "hi", "stream": True},
            headers={"authorization": f"Bearer {KEY}"},
        )
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.content == b"".join(
        [_sse("text", {"text": t}) for t in ("HELLO", ", ", "WORLD", "!")] + [_sse("done", {"events": 4})]
    )
    sent = upstream.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == SERVED
    assert 'cachegate_tokens_total{kind="output",model="kimi",team="ok"} 7.0' in metrics
    ttft = f'cachegate_ttft_seconds_count{{backend="127.0.0.1:{upstream.port}",model="kimi",team="ok"}} 1.0'
    assert ttft in metrics
    assert 'cachegate_http_requests_total{method="POST",route="/v1/shout",status="200"} 1.0' in metrics


async def test_a_whole_answer_is_translated(upstream: FakeUpstream) -> None:
    surface = ShoutSurface()
    async with _app(upstream.url, surface) as (_, client):
        response = await client.post(
            "/v1/shout", json={"model": "kimi", "text": "hi"}, headers={"authorization": f"Bearer {KEY}"}
        )
    assert response.status_code == 200 and response.json() == {"text": "HELLO, WORLD!"}
    (target,) = surface.targets
    assert target.upstream_model == SERVED and target.rank is None
    assert target.config is not None and target.config.url == upstream.url, "the builder may choose per backend"


@pytest.mark.parametrize(
    ("key", "body", "status", "kind", "code"),
    [
        (BLOCKED, {"model": "kimi", "text": "hi"}, 429, "rate_limit_error", "team_queue_full"),
        (KEY, {"model": "kimi"}, 400, "invalid_request_error", "invalid_request"),
        (KEY, {"model": "nope", "text": "hi"}, 404, "not_found_error", "model_not_found"),
        ("sk-wrong", {"model": "kimi", "text": "hi"}, 401, "api_error", "invalid_api_key"),
    ],
)
async def test_every_error_comes_in_the_surfaces_envelope(
    upstream: FakeUpstream, key: str, body: dict[str, Any], status: int, kind: str, code: str
) -> None:
    async with _app(upstream.url) as (_, client):
        response = await client.post("/v1/shout", json=body, headers={"authorization": f"Bearer {key}"})
    assert response.status_code == status
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == kind
    assert response.headers["x-cachegate-code"] == code and response.headers["x-request-id"].startswith("cg-")
    if status == 429:
        assert int(response.headers["retry-after"]) >= 1


async def test_chat_and_completions_are_surfaces_too() -> None:
    surfaces = default_surfaces()
    assert {s.path for s in surfaces} == {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
    assert all(isinstance(s, Surface) for s in surfaces)


class CrashingSurface(ShoutSurface):
    def parse(self, raw: bytes) -> ClientRequest:
        raise RuntimeError("a bug in the surface")


async def test_a_crash_on_a_surface_is_a_500_in_its_envelope(upstream: FakeUpstream) -> None:
    # The request path answers its own crashes in the surface's envelope (Starlette's error middleware,
    # on every route, would answer in OpenAI's), and the access log counts a 500.
    async with _app(upstream.url, CrashingSurface()) as (app, _):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            response = await client.post("/v1/shout", json={"model": "kimi", "text": "hi"}, headers=AUTH)
            metrics = (await client.get("/metrics")).text
    assert response.status_code == 500
    assert response.json() == {"type": "error", "error": {"type": "api_error", "message": "Internal server error."}}
    assert response.headers["x-cachegate-code"] == "internal_error"
    assert 'cachegate_http_requests_total{method="POST",route="/v1/shout",status="500"} 1.0' in metrics
