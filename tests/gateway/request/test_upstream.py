"""gateway/request/upstream.py: ``Upstream.forward`` (the upstream attempts of one dispatched request:
one retry elsewhere when nothing reached, whose fault a failure is) and the ``Exchange`` it fills.

Each test starts the gateway in-process (tests/gateway/asgi.py) over scripted upstreams on loopback
(tests/fake_upstream.py, tests/hostile_upstream.py), then calls the worker's own ``Upstream``
directly with a request the dispatcher admitted, so that the ``Exchange`` can be read."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from gateway.config.schema import Config
from gateway.http.errors import GatewayError
from gateway.observability.spans import NULL_TRACE
from gateway.relay.proxy import Result
from gateway.request.lifecycle import request_id
from gateway.request.upstream import Exchange
from gateway.surfaces.chat import CHAT
from gateway.worker import Gateway
from policies.types import Dispatch, Outcome, RequestFacts
from tests.fake_upstream import SERVED, USAGE, FakeUpstream
from tests.gateway.asgi import config, running
from tests.gateway.asgi import gateway_of as _gw
from tests.hostile_upstream import HostileUpstream


class Recorder:
    """An ASGI ``send`` that keeps every message."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.messages if m["type"] == "http.response.start")

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")


def admit(gw: Gateway, stream: bool = False) -> tuple[str, Dispatch]:
    rid = request_id()
    facts = RequestFacts(rid=rid, model="kimi", team="default", stream=stream, prompt_tokens=10, max_output_tokens=10)
    decision = gw.dispatcher.admit_now(facts)
    assert isinstance(decision, Dispatch)
    return rid, decision


async def forward(
    app: Starlette, content: str, stream: bool = False, admitted: tuple[str, Dispatch] | None = None
) -> tuple[Exchange, Recorder, list[Dispatch]]:
    """One request through ``Upstream.forward``; returns the exchange, what the client got and the
    retries routed."""
    gw = _gw(app)
    body: dict[str, Any] = {"model": "kimi", "stream": stream, "messages": [{"role": "user", "content": content}]}
    req = CHAT.parse(orjson.dumps(body))
    req.model, req.team = "kimi", "default"
    rid, decision = admitted or admit(gw, stream)
    sent, routed, exchange = Recorder(), [], Exchange()
    try:
        returned = await gw.upstream.forward(rid, req, CHAT, decision, sent, NULL_TRACE, routed.append, exchange)
        assert returned is exchange
    finally:
        gw.dispatcher.release(rid, Outcome(ok=exchange.ok, reached_backend=exchange.reached_backend))
    return exchange, sent, routed


async def errors(client: httpx.AsyncClient, backend: str, kind: str) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(rf'cachegate_upstream_errors_total{{backend="{backend}",kind="{kind}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


# ----- Exchange ------------------------------------------------------------------------------------


def test_an_exchange_is_ok_only_for_a_200_relayed_whole() -> None:
    assert not Exchange().ok and not Exchange().refused and not Exchange().reached_backend
    assert Exchange(status=200).ok
    assert not Exchange(status=200, result=Result(stream_error="timeout")).ok
    assert not Exchange(status=200, error=GatewayError(502, "x", "upstream_error")).ok
    assert not Exchange(status=503).ok


@pytest.mark.parametrize(("status", "refused"), [(200, False), (399, False), (400, True), (429, True), (500, False)])
def test_only_a_4xx_answer_is_the_engine_refusing(status: int, refused: bool) -> None:
    assert Exchange(status=status).refused is refused


# ----- answers -------------------------------------------------------------------------------------


async def test_a_stream_is_relayed_and_the_exchange_says_it_reached_and_answered(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (app, _):
        exchange, sent, routed = await forward(app, "hello", stream=True)
    assert exchange.ok and exchange.status == 200 and exchange.reached_backend and exchange.error is None
    assert exchange.backend == f"127.0.0.1:{upstream.port}" and routed == []
    assert exchange.result.usage == USAGE and exchange.result.first_token_at is not None
    assert sent.status == 200 and b"world" in sent.body
    seen = upstream.requests[-1]
    assert seen["body"]["model"] == SERVED and seen["headers"]["x-request-id"].startswith("cg-")
    assert seen["headers"]["accept"] == "application/json, text/event-stream"


async def test_a_whole_answer_counts_its_tokens(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (app, _):
        exchange, sent, _ = await forward(app, "hello")
    assert exchange.ok and exchange.result.completion_tokens == 7 and exchange.result.cached_tokens == 5
    assert sent.status == 200 and orjson.loads(sent.body)["choices"][0]["message"]["content"] == "Hello, world!"


async def test_a_4xx_answer_is_relayed_as_the_engine_refusing_and_blames_nobody(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (app, client):
        upstream.error_status = 400
        try:
            exchange, sent, routed = await forward(app, "hello")
        finally:
            upstream.error_status = None
        backend = _gw(app).pool.get("kimi", exchange.backend)  # type: ignore[union-attr]
        assert backend.breaker.streak == 0 and backend.healthy
        assert await errors(client, exchange.backend, "status_5xx") == 0
    assert exchange.status == 400 and exchange.refused and exchange.reached_backend and not exchange.ok
    assert exchange.error is None and routed == []
    assert sent.status == 400 and orjson.loads(sent.body)["error"]["message"] == "scripted failure"


async def test_a_5xx_answer_is_relayed_counted_and_held_against_the_backend(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (app, client):
        upstream.error_status = 503
        try:
            exchange, sent, routed = await forward(app, "hello")
        finally:
            upstream.error_status = None
        backend = _gw(app).pool.get("kimi", exchange.backend)  # type: ignore[union-attr]
        assert backend.breaker.streak == 1 and backend.last_error == "answered 503"
        assert await errors(client, exchange.backend, "status_5xx") == 1
        await forward(app, "hello")
        assert backend.breaker.streak == 0, "the next good answer resets the streak"
    assert exchange.status == 503 and not exchange.refused and exchange.reached_backend and routed == []
    assert sent.status == 503


# ----- failures before an answer -------------------------------------------------------------------


async def test_a_dead_backend_is_retried_once_elsewhere(upstream: FakeUpstream) -> None:
    dead = FakeUpstream()
    with dead.running():
        async with running(config(dead.url, upstream.url, policy="direct")) as (app, client):
            dead.stop()
            gw = _gw(app)
            dead_name = f"127.0.0.1:{dead.port}"
            rid, decision = admit(gw)
            if decision.backend != dead_name:  # round robin: the next one goes to the dead backend
                gw.dispatcher.release(rid, Outcome())
                rid, decision = admit(gw)
            assert decision.backend == dead_name
            exchange, sent, routed = await forward(app, "hello", admitted=(rid, decision))
            assert not gw.pool.get("kimi", dead_name).healthy, "a refused connection trips the breaker"  # type: ignore[union-attr]
            assert await errors(client, dead_name, "connect") == 1
    assert [(d.backend, d.reason) for d in routed] == [(f"127.0.0.1:{upstream.port}", "retry")]
    assert exchange.ok and exchange.backend == f"127.0.0.1:{upstream.port}" and exchange.reached_backend
    assert sent.status == 200


async def test_nowhere_to_retry_is_a_502_and_nothing_reached() -> None:
    dead = FakeUpstream()
    with dead.running():
        async with running(config(dead.url, policy="direct")) as (app, _):
            dead.stop()
            exchange, sent, routed = await forward(app, "hello")
    assert routed == [] and sent.messages == [], "the path answers the error, not the relay"
    assert exchange.error is not None and (exchange.error.status, exchange.error.code) == (502, "upstream_unreachable")
    assert not exchange.reached_backend and not exchange.ok


async def test_silence_past_the_idle_timeout_is_a_504_blamed_unless_the_loop_lagged(upstream: FakeUpstream) -> None:
    cfg = config(upstream.url, policy="direct", upstream={"idle_timeout_s": 0.1})
    async with running(cfg) as (app, client):
        gw = _gw(app)
        exchange, sent, routed = await forward(app, "stall")
        backend = gw.pool.get("kimi", exchange.backend)  # type: ignore[union-attr]
        assert backend.breaker.streak == 1, "a timeout is the backend's fault"
        assert await errors(client, exchange.backend, "timeout") == 1
        gw.upstream.lagging = lambda: True
        lagged, _, _ = await forward(app, "stall")
        assert backend.breaker.streak == 1, "a timeout while the loop lagged proves nothing about the backend"
    for ex in (exchange, lagged):
        assert ex.error is not None and (ex.error.status, ex.error.code) == (504, "upstream_timeout")
        assert ex.reached_backend and not ex.ok
    assert routed == [] and sent.messages == []


async def test_a_full_connection_budget_is_the_workers_overload_not_the_backends(upstream: FakeUpstream) -> None:
    cfg = config(upstream.url, policy="direct", upstream={"max_connections": 1, "connect_timeout_s": 0.1})
    async with running(cfg) as (app, client):
        gw = _gw(app)
        holder = asyncio.create_task(forward(app, "stall", stream=True))  # holds the one connection
        for _ in range(50):
            await asyncio.sleep(0.01)
            if upstream.connections and upstream.connections[-1].streaming:
                break
        exchange, sent, routed = await forward(app, "hello")
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        backend = gw.pool.get("kimi", exchange.backend)  # type: ignore[union-attr]
        assert backend.healthy and backend.breaker.streak == 0
        assert await errors(client, exchange.backend, "connect") == 0
    assert exchange.error is not None and (exchange.error.status, exchange.error.code) == (503, "overloaded")
    assert exchange.error.headers == {"retry-after": str(cfg.overload.retry_after_s)}
    assert not exchange.reached_backend and routed == [] and sent.messages == []


async def test_a_malformed_response_is_a_502_not_retried_and_blamed() -> None:
    hostile, other = HostileUpstream(), FakeUpstream()
    with hostile.running(), other.running():
        async with running(config(hostile.url, other.url, policy="direct")) as (app, client):
            gw = _gw(app)
            hostile_name = f"127.0.0.1:{hostile.port}"
            rid, decision = admit(gw)
            if decision.backend != hostile_name:
                gw.dispatcher.release(rid, Outcome())
                rid, decision = admit(gw)
            exchange, sent, routed = await forward(app, "case:garbage_status_line", admitted=(rid, decision))
            assert gw.pool.get("kimi", hostile_name).breaker.streak == 1  # type: ignore[union-attr]
            assert await errors(client, hostile_name, "malformed") == 1
    assert exchange.error is not None and exchange.error.status == 502
    assert exchange.error.code == "upstream_malformed_response"
    assert exchange.reached_backend and exchange.backend == hostile_name
    assert routed == [] and other.requests == [], "the backend had the request: no retry"
    assert sent.messages == [], "the path answers the error, not the relay"


async def test_a_request_cancelled_mid_attempt_counts_as_reached(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct")) as (app, _):
        gw = _gw(app)
        body = {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "stall"}]}
        req = CHAT.parse(orjson.dumps(body))
        req.model = "kimi"
        rid, decision = admit(gw, stream=True)
        exchange = Exchange()
        task = asyncio.create_task(
            gw.upstream.forward(rid, req, CHAT, decision, Recorder(), NULL_TRACE, lambda d: None, exchange)
        )
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gw.dispatcher.release(rid, Outcome(ok=False, reached_backend=exchange.reached_backend))
    assert exchange.reached_backend and exchange.backend == f"127.0.0.1:{upstream.port}" and not exchange.ok


async def test_a_backend_that_publishes_nothing_learns_from_streamed_answers_only(upstream: FakeUpstream) -> None:
    cfg = Config.model_validate(
        {
            "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": upstream.url, "engine": "openai"}]}},
            "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            "policy": "direct",
        }
    )
    async with running(cfg) as (app, _):
        backend = _gw(app).pool.get("kimi", f"127.0.0.1:{upstream.port}")  # type: ignore[union-attr]
        assert backend.limiter is not None
        await forward(app, "hello")
        assert backend.limiter.samples == 0 and backend.inflight == 0, "a whole answer teaches no prefill time"
        exchange, _, _ = await forward(app, "hello", stream=True)
        assert exchange.ok and backend.limiter.samples == 1 and backend.inflight == 0
