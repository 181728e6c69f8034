"""The surface plug-in interface (gateway/surfaces/base.py): ``PassthroughRelay`` (chat's byte-exact relay
and its whole answers, upstream errors re-shaped), ``TranslatingRelay`` on the one relay loop (each event,
keep-alives and a broken upstream through ``translate_event``, chat's accounting), the OpenAI error
envelope and a ``Surface``'s defaults. Streams run over loopback (tests/gateway/relay/test_events.py).

(tests/gateway/test_surface_plugin.py plugs a made-up surface into the whole request path.)"""

from __future__ import annotations

import orjson
import pytest

from gateway.http.errors import GatewayError
from gateway.http.wire import SILENCE
from gateway.relay.proxy import Result
from gateway.surfaces.base import (
    ClientRequest,
    ErrorReply,
    PassthroughRelay,
    RelayContext,
    Surface,
    Target,
    TranslatingRelay,
    UpstreamCall,
    openai_error,
)
from tests.fake_upstream import USAGE
from tests.gateway.relay.streams import DONE, STREAM, USAGE_ONLY, WORDS, Sent, sse_answer, upstream_response
from tests.hostile_upstream import chunked_head, frames


def _ctx(keepalive_s: float = 0) -> tuple[RelayContext, list[int]]:
    firsts: list[int] = []
    return RelayContext(Result(), lambda: firsts.append(1), keepalive_s, [(b"x-request-id", b"cg-7")]), firsts


COMPLETION = orjson.dumps(
    {"model": "served/kimi", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], "usage": USAGE}
)


# ---- PassthroughRelay ----


@pytest.mark.parametrize("strip", [True, False])
async def test_passthrough_stream_is_byte_exact_but_for_the_injected_usage(strip: bool) -> None:
    ctx, firsts = _ctx()
    sent = Sent()
    async with upstream_response(sse_answer(STREAM)) as response:
        await PassthroughRelay(strip_usage=strip).stream(response, sent, ctx)
    expected = b"".join(e for e in STREAM if not (strip and e == USAGE_ONLY))
    assert sent.body == expected and (b"x-request-id", b"cg-7") in sent.headers
    assert firsts == [1] and ctx.result.usage == USAGE and ctx.result.client_bytes == len(expected)


async def test_passthrough_whole_answer_reports_usage_and_first_token() -> None:
    ctx, firsts = _ctx()
    sent = Sent()
    await PassthroughRelay(strip_usage=False).whole(200, COMPLETION, b"application/json", sent, ctx)
    assert sent.status == 200 and sent.body == COMPLETION
    assert (b"content-type", b"application/json") in sent.headers and (b"x-request-id", b"cg-7") in sent.headers
    assert firsts == [1] and ctx.result.first_token_at is not None and ctx.result.completion_tokens == 7
    assert ctx.result.finish_reasons == ["stop"]


async def test_passthrough_whole_answer_without_output_has_no_first_token() -> None:
    ctx, firsts = _ctx()
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 0}})
    await PassthroughRelay(strip_usage=False).whole(200, body, b"application/json", Sent(), ctx)
    assert firsts == [] and ctx.result.first_token_at is None and ctx.result.prompt_tokens == 3


async def test_passthrough_upstream_error_takes_openais_envelope_with_its_status() -> None:
    ctx, firsts = _ctx()
    sent = Sent()
    flat = b'{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}'
    await PassthroughRelay(strip_usage=True).whole(400, flat, b"text/plain", sent, ctx)
    assert sent.status == 400 and (b"content-type", b"application/json") in sent.headers
    assert orjson.loads(sent.body) == {
        "error": {"message": "too long", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert firsts == [] and ctx.result.usage is None


async def test_passthrough_other_statuses_pass_as_they_are() -> None:
    sent = Sent()
    await PassthroughRelay(strip_usage=True).whole(204, b"", b"text/plain", sent, _ctx()[0])
    assert sent.status == 204 and sent.body == b"" and (b"content-type", b"text/plain") in sent.headers


# ---- TranslatingRelay ----


class Tagged(TranslatingRelay):
    """Each upstream event tagged with what it was; a start and a finish line."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def translate_event(self, event: bytes) -> bytes:
        self.seen.append(event)
        if event is SILENCE:
            return b"event: ping\n\n"
        return b"event: chat\ndata: %d\n\n" % len(event)

    def start_stream(self) -> bytes:
        return b"event: start\n\n"

    def finish_stream(self) -> bytes:
        return b"event: finish\n\n"

    def translate_whole(self, status: int, payload: bytes, content_type: bytes) -> tuple[int, bytes, bytes]:
        return status + 1, payload.upper(), b"text/x-upper"


async def test_translating_stream_feeds_every_event_and_accounts_like_chat() -> None:
    relay, (ctx, firsts), sent = Tagged(), _ctx(), Sent()
    async with upstream_response(sse_answer(STREAM)) as response:
        await relay.stream(response, sent, ctx)
    assert relay.seen == STREAM, "every event, the usage chunk too: nothing is stripped before the translator"
    assert sent.body == b"event: start\n\n" + b"".join(b"event: chat\ndata: %d\n\n" % len(e) for e in STREAM) + (
        b"event: finish\n\n"
    )
    assert firsts == [1] and ctx.result.usage == USAGE and ctx.result.finish_reasons == ["stop"]
    assert ctx.result.client_bytes == len(sent.body)


async def test_translating_stream_keepalives_go_through_the_translator() -> None:
    relay, (ctx, _), sent = Tagged(), _ctx(keepalive_s=0.04), Sent()
    answer = [chunked_head(True) + frames(WORDS[0]), 0.1, frames(DONE) + b"0\r\n\r\n"]
    async with upstream_response(*answer) as response:
        await relay.stream(response, sent, ctx)
    assert SILENCE in relay.seen and b"event: ping\n\n" in sent.body and SILENCE not in sent.body


async def test_translating_stream_broken_upstream_is_chats_error_then_done_translated() -> None:
    relay, (ctx, _), sent = Tagged(), _ctx(), Sent()
    async with upstream_response(sse_answer(STREAM[:2], end=False) + frames(b'data: {"cut'), "close") as response:
        await relay.stream(response, sent, ctx)
    error, done = relay.seen[-2:]
    assert orjson.loads(error[6:])["error"]["code"] == "upstream_stream_broken" and done == DONE
    assert ctx.result.stream_error == "stream_broken"
    assert not any(b"cut" in e for e in relay.seen), "an incomplete last event cannot be translated: dropped"
    assert sent.body.endswith(b"event: finish\n\n")


async def test_translating_whole_answer() -> None:
    relay, (ctx, firsts), sent = Tagged(), _ctx(), Sent()
    await relay.whole(200, COMPLETION, b"application/json", sent, ctx)
    assert sent.status == 201 and sent.body == COMPLETION.upper()
    assert (b"content-type", b"text/x-upper") in sent.headers and (b"x-request-id", b"cg-7") in sent.headers
    assert firsts == [1] and ctx.result.usage == USAGE
    errors, (ctx, firsts), sent = Tagged(), _ctx(), Sent()
    await errors.whole(500, b'{"usage": {"completion_tokens": 3}}', b"application/json", sent, ctx)
    assert sent.status == 501 and firsts == [] and ctx.result.usage is None, "an error's body is not read for usage"


# ---- envelopes and defaults ----


def test_openai_error_envelope_and_headers() -> None:
    reply = openai_error(GatewayError(429, "slow down", "team_queue_full", None, {"Retry-After": "3"}))
    assert reply == ErrorReply(
        429,
        orjson.dumps(
            {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "team_queue_full"}}
        ),
        b"application/json",
        [(b"retry-after", b"3")],
    )
    param = openai_error(GatewayError(400, "bad", "invalid_request", "messages[0]"))
    assert orjson.loads(param.body)["error"]["param"] == "messages[0]" and param.headers == []


class Minimal(Surface):
    name = "minimal"
    path = "/v1/minimal"

    def parse(self, raw: bytes) -> ClientRequest:
        return ClientRequest("kimi", False, None, {"prompt": raw.decode()}, {})

    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        return UpstreamCall("/v1/completions", b"{}", PassthroughRelay(strip_usage=False))


async def test_a_surface_needs_only_parse_and_upstream() -> None:
    with pytest.raises(TypeError):
        Surface()  # type: ignore[abstract]
    surface = Minimal()
    req = surface.parse(b"hi")
    assert (req.headers, req.team, req.client, req.fingerprint, req.prompt_bytes, req.native) == (
        {},
        "",
        None,
        (),
        0,
        None,
    )
    assert surface.bind(object()) is None and await surface.prepare(req) is None and await surface.close() is None
    assert surface.waiting() == b": keepalive\n\n"
    err = GatewayError(503, "no backend", "no_healthy_backend")
    assert surface.error(err) == openai_error(err)
    assert surface.stream_error(503, b'{"error":{}}') == b'data: {"error":{}}\n\ndata: [DONE]\n\n'
    call = surface.upstream(req, Target("b", "served", None))
    assert call.headers == {} and isinstance(call.relay, PassthroughRelay)
