"""Chat and completions as surfaces (gateway/surfaces/chat.py): the parser's request facts, the upstream
call per backend (served model, DP rank, usage asked for and dropped again), and both routes through
the in-process app to a scripted upstream."""

from __future__ import annotations

import orjson
import pytest

from gateway.http.errors import GatewayError
from gateway.surfaces.base import PassthroughRelay, Target
from gateway.surfaces.chat import CHAT, COMPLETIONS, OpenAISurface
from gateway.surfaces.openai import ParsedRequest
from tests.fake_upstream import SERVED, USAGE, FakeUpstream
from tests.gateway.asgi import config, running

TARGET = Target("b1", "served/kimi", None)


def test_the_two_surfaces() -> None:
    assert (CHAT.name, CHAT.path, CHAT.kind) == ("chat", "/v1/chat/completions", "chat")
    assert (COMPLETIONS.name, COMPLETIONS.path, COMPLETIONS.kind) == ("completion", "/v1/completions", "completion")


def test_parse_gives_the_request_facts() -> None:
    body = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 9}
    req = CHAT.parse(orjson.dumps(body))
    assert (req.model, req.stream, req.max_tokens) == ("kimi", True, 9)
    assert req.prompt == body and req.body == body, "the whole chat body is what is fingerprinted"
    assert isinstance(req.native, ParsedRequest) and req.native.kind == "chat"
    completion = COMPLETIONS.parse(b'{"model": "kimi", "prompt": [1, 2, 3]}')
    assert completion.prompt == {"model": "kimi", "prompt": [1, 2, 3]} and completion.max_tokens is None


def test_each_surface_checks_its_own_shape() -> None:
    with pytest.raises(GatewayError) as err:
        COMPLETIONS.parse(b'{"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}')
    assert err.value.param == "prompt"
    with pytest.raises(GatewayError) as err:
        OpenAISurface("chat").parse(b'{"model": "kimi", "prompt": "hi"}')
    assert err.value.param == "messages"


@pytest.mark.parametrize(
    ("options", "strip", "sent_options"),
    [
        (None, True, {"include_usage": True}),
        ({"include_usage": True}, False, {"include_usage": True}),
        ({"include_usage": False}, True, {"include_usage": True}),
    ],
)
def test_a_stream_asks_for_usage_and_drops_it_only_if_the_client_did_not(
    options: dict[str, bool] | None, strip: bool, sent_options: dict[str, bool]
) -> None:
    body = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    if options is not None:
        body["stream_options"] = options
    call = CHAT.upstream(CHAT.parse(orjson.dumps(body)), TARGET)
    assert call.path == "/v1/chat/completions" and call.headers == {}
    assert isinstance(call.relay, PassthroughRelay) and call.relay.strip_usage is strip
    sent = orjson.loads(call.body)
    assert sent["stream_options"] == sent_options and sent["model"] == "served/kimi"


def test_the_upstream_call_pins_the_rank_and_keeps_the_rest() -> None:
    req = COMPLETIONS.parse(b'{"model": "kimi", "prompt": "hi", "temperature": 0.3, "max_tokens": 4}')
    call = COMPLETIONS.upstream(req, Target("b1", "served/other", 2))
    assert call.path == "/v1/completions"
    assert orjson.loads(call.body) == {
        "model": "served/other",
        "prompt": "hi",
        "temperature": 0.3,
        "max_tokens": 4,
        "routed_dp_rank": 2,
    }
    assert isinstance(call.relay, PassthroughRelay) and call.relay.strip_usage is False
    assert req.body["model"] == "kimi", "one request, many attempts: the parsed body is not changed"


async def test_both_routes_through_the_app(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (_, client):
        completion = await client.post("/v1/completions", json={"model": "kimi", "prompt": "hi"})
        streamed = await client.post(
            "/v1/chat/completions",
            json={"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert completion.status_code == 200 and completion.json()["usage"] == USAGE
    assert upstream.requests[-2]["path"] == "/v1/completions" and upstream.requests[-2]["body"]["model"] == SERVED
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.content == b"".join(e for e in upstream.sent if b'"choices":[]' not in e)
    assert upstream.requests[-1]["body"]["stream_options"] == {"include_usage": True}


async def test_a_bad_body_is_openais_400(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (_, client):
        response = await client.post("/v1/completions", content=b'{"model": "kimi", "prompt": ""}')
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "'prompt' must not be empty.",
        "type": "invalid_request_error",
        "param": "prompt",
        "code": "invalid_request",
    }
