"""``POST /v1/messages`` as a surface (gateway/surfaces/messages.py): the parser (translated to chat at once,
billing header gone), Anthropic's error envelope with the cachegate code in a header, ``ping`` while
waiting, the in-stream error event, and the upstream call per backend mode (chat translated, or the
backend's own /v1/messages with the Anthropic headers forwarded); then whole and streamed answers
through the in-process app, translated from a scripted chat upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from anthropic.types import Message

from gateway.config.schema import Config
from gateway.http.errors import GatewayError
from gateway.surfaces.base import Target
from gateway.surfaces.chat import CHAT, COMPLETIONS
from gateway.surfaces.messages import MessagesRun, MessagesSurface
from gateway.surfaces.native_relay import NativeRelay
from gateway.surfaces.responses import ResponsesSurface
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translated_relay import TranslatedRelay
from gateway.worker import Gateway
from tests.fake_upstream import SERVED, USAGE, FakeUpstream
from tests.gateway.asgi import running

BILLING = "x-anthropic-billing-header: cc_version=2.1; cch=abc;"
BODY = {
    "model": "kimi",
    "max_tokens": 64,
    "system": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Be brief."}],
    "messages": [{"role": "user", "content": "hi"}],
}


@pytest.fixture()
async def app(upstream: FakeUpstream) -> AsyncIterator[tuple[MessagesSurface, Gateway, Any]]:
    """Model ``kimi`` translated on a chat backend; model ``native`` on a backend that serves /v1/messages."""
    config = Config.model_validate(
        {
            "models": {
                "kimi": {"upstream_model": SERVED, "backends": [{"url": upstream.url, "name": "chat"}]},
                "native": {
                    "upstream_model": "served/native",
                    "backends": [{"url": upstream.url, "name": "own", "surfaces": {"messages": "passthrough"}}],
                },
            },
            "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            "policy": "direct",
        }
    )
    surface = MessagesSurface()
    async with running(config, surfaces=[CHAT, COMPLETIONS, ResponsesSurface(), surface]) as (starlette, client):
        yield surface, starlette.state.gateway, client


def _parse(surface: MessagesSurface, **fields: Any) -> Any:
    return surface.parse(orjson.dumps({**BODY, **fields}))


# ---- the surface's parts ----


def test_parse_translates_to_chat_without_the_billing_header() -> None:
    req = _parse(MessagesSurface(), stream=True)
    assert (req.model, req.stream, req.max_tokens) == ("kimi", True, 64)
    assert req.prompt["messages"][0] == {"role": "system", "content": "Be brief."}, "the prompt is the chat body"
    assert req.body["system"][0]["text"] == BILLING, "the client's body is kept as sent"
    assert isinstance(req.native, MessagesRun) and req.native.message_id.startswith("msg_")
    assert req.native.req.chat is req.prompt


DEEP = orjson.dumps(BODY)[:-1] + b',"x":' + b"[" * 70 + b"]" * 70 + b"}"


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (orjson.dumps({**BODY, "max_tokens": 0}), "invalid_request", "max_tokens"),
        (b"[]", "invalid_request", None),
        (DEEP, "request_too_complex", "x" + "[0]" * 63),  # bounded before translating: a 400, never a 500
    ],
)
def test_bad_bodies_are_400(raw: bytes, code: str, param: str | None) -> None:
    with pytest.raises(GatewayError) as err:
        MessagesSurface().parse(raw)
    assert (err.value.status, err.value.code, err.value.param) == (400, code, param)


def test_errors_in_anthropics_envelope_with_the_code_in_a_header() -> None:
    surface = MessagesSurface()
    reply = surface.error(GatewayError(429, "Team queue is full.", "team_queue_full", None, {"Retry-After": "2"}))
    assert reply.status == 429 and reply.content_type == b"application/json"
    assert orjson.loads(reply.body) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "Team queue is full."},
    }
    assert reply.headers == [(b"retry-after", b"2"), (b"x-cachegate-code", b"team_queue_full")]
    assert surface.error(GatewayError(500, "boom")).headers == []


def test_waiting_pings_and_a_late_error_is_one_event() -> None:
    surface = MessagesSurface()
    assert SSEDecoder().feed(surface.waiting()) == [{"type": "ping"}]
    body = surface.error(GatewayError(503, "Queue timed out.", "queue_timeout")).body
    assert surface.stream_error(503, body) == b"event: error\ndata: " + body + b"\n\n"
    assert SSEDecoder().feed(surface.stream_error(502, b"Bad Gateway")) == [
        {"type": "error", "error": {"type": "api_error", "message": "Bad Gateway"}}
    ]


async def test_upstream_translated_on_a_chat_backend(app: tuple[MessagesSurface, Gateway, Any]) -> None:
    surface, _, _ = app
    req = _parse(surface, stream=True)
    req.prompt_bytes = 400
    call = surface.upstream(req, Target("chat", "served/kimi", 1))
    assert call.path == "/v1/chat/completions" and call.headers == {}
    sent = orjson.loads(call.body)
    assert (sent["model"], sent["routed_dp_rank"], sent["stream"]) == ("served/kimi", 1, True)
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
    assert req.native.req.chat["model"] == "kimi", "each attempt gets its own copy"
    assert isinstance(call.relay, TranslatedRelay) and call.relay.translator is not None
    start = SSEDecoder().feed(call.relay.start_stream())[0]
    assert start["message"]["id"] == req.native.message_id and start["message"]["usage"]["input_tokens"] > 0
    whole = surface.upstream(_parse(surface), Target("chat", "served/kimi", None))
    assert isinstance(whole.relay, TranslatedRelay) and whole.relay.translator is None
    assert "routed_dp_rank" not in orjson.loads(whole.body)


async def test_upstream_passthrough_to_a_backend_that_serves_messages(
    app: tuple[MessagesSurface, Gateway, Any],
) -> None:
    surface, _, _ = app
    req = _parse(surface, model="native")
    req.headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "tools", "authorization": "Bearer k"}
    call = surface.upstream(req, Target("own", "served/native", 0))
    assert call.path == "/v1/messages" and isinstance(call.relay, NativeRelay) and call.relay.kind == "messages"
    assert call.headers == {"anthropic-version": "2023-06-01", "anthropic-beta": "tools"}
    sent = orjson.loads(call.body)
    assert sent["system"] == [{"type": "text", "text": "Be brief."}] and sent["model"] == "served/native"
    assert sent["routed_dp_rank"] == 0 and sent["messages"] == BODY["messages"]
    assert req.body["model"] == "native" and len(req.body["system"]) == 2, "the client's body is not changed"
    status, body = call.relay.reshape(404, b'{"detail": "Not Found"}')
    assert status == 404 and orjson.loads(body)["error"] == {"type": "not_found_error", "message": "Not Found"}


# ---- through the app ----


async def test_a_whole_answer(app: tuple[MessagesSurface, Gateway, Any], upstream: FakeUpstream) -> None:
    _, _, client = app
    response = await client.post("/v1/messages", json=BODY)
    assert response.status_code == 200
    message = Message.model_validate(response.json())
    assert message.content[0].text == "Hello, world!" and message.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert message.usage.input_tokens == 6 and message.usage.cache_read_input_tokens == 5
    assert message.model == "kimi" and message.id.startswith("msg_")
    sent = upstream.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == SERVED
    assert "x-anthropic-billing-header" not in orjson.dumps(sent["body"]).decode()


async def test_a_streamed_answer(app: tuple[MessagesSurface, Gateway, Any]) -> None:
    _, _, client = app
    response = await client.post("/v1/messages", json={**BODY, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = SSEDecoder().feed(response.content)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "Hello, world!"
    assert events[-2]["usage"]["output_tokens"] == USAGE["completion_tokens"]


async def test_an_unknown_model_in_anthropics_envelope(app: tuple[MessagesSurface, Gateway, Any]) -> None:
    _, _, client = app
    response = await client.post("/v1/messages", json={**BODY, "model": "nope"})
    assert response.status_code == 404 and response.headers["x-cachegate-code"] == "model_not_found"
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "not_found_error"
