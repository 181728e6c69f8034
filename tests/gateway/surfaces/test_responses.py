"""``POST /v1/responses`` as a surface (gateway/surfaces/responses.py): the parser, ``previous_response_id``
resolved through the store for the caller's team, the upstream call per backend mode (chat translated,
or the backend's own /v1/responses with the stored conversation expanded), the final Response stored
(in progress first when streamed), a stream cancelled on this replica, and the store the worker's
config chooses (memory, or Redis shared by replicas). Answers come from a scripted chat upstream
through the in-process app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from openai.types.responses import Response

from gateway.config.schema import Config
from gateway.http.errors import GatewayError
from gateway.surfaces.base import Target
from gateway.surfaces.chat import CHAT, COMPLETIONS
from gateway.surfaces.messages import MessagesSurface
from gateway.surfaces.native_relay import NativeRelay
from gateway.surfaces.response_store import MemoryResponseStore, RedisResponseStore, StoredResponse
from gateway.surfaces.responses import ResponsesRun, ResponsesSurface
from gateway.surfaces.translate.common import SSEDecoder
from gateway.surfaces.translated_relay import TranslatedRelay
from tests.fake_upstream import SERVED, FakeUpstream
from tests.gateway.asgi import call_and_leave, running

TEAM = "default"
"""The team of a caller when no keys are configured."""
PRIOR_INPUT = [{"type": "message", "role": "user", "content": "first"}]
PRIOR_OUTPUT = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "one"}]}]


def _config(url: str, **extra: Any) -> Config:
    """Model ``kimi`` translated on a chat backend; model ``native`` on a backend that serves /v1/responses."""
    return Config.model_validate(
        {
            "models": {
                "kimi": {"upstream_model": SERVED, "backends": [{"url": url, "name": "chat"}]},
                "native": {
                    "upstream_model": "served/native",
                    "backends": [{"url": url, "name": "own", "surfaces": {"responses": "passthrough"}}],
                },
            },
            "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            "policy": "direct",
            **extra,
        }
    )


@pytest.fixture()
async def app(upstream: FakeUpstream) -> AsyncIterator[tuple[ResponsesSurface, Any, Any]]:
    surface = ResponsesSurface()
    async with running(_config(upstream.url), surfaces=[CHAT, COMPLETIONS, surface, MessagesSurface()]) as (
        starlette,
        client,
    ):
        yield surface, starlette, client


async def _prior(surface: ResponsesSurface, team: str = "") -> None:
    await surface.store.put(
        StoredResponse("resp_prior", team or None, "kimi", "completed", 1.0, PRIOR_INPUT, {"output": PRIOR_OUTPUT})
    )


# ---- the surface's parts ----


def test_parse_translates_to_chat_and_keeps_the_body_for_prepare() -> None:
    body = {"model": "kimi", "input": "hi", "instructions": "be brief", "max_output_tokens": 20, "stream": True}
    req = ResponsesSurface().parse(orjson.dumps(body))
    assert (req.model, req.stream, req.max_tokens) == ("kimi", True, 20)
    assert req.prompt["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert req.native == body and req.body == body


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"model": "kimi", "input": "x", "previous_response_id": 7}, "invalid_request", "previous_response_id"),
        ({"model": "kimi", "input": "x", "background": True}, "unsupported_parameter", "background"),
        ({"model": "kimi", "input": [["not an item"]]}, "invalid_request", "input[0]"),
    ],
)
def test_bad_bodies_are_400(body: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(GatewayError) as err:
        ResponsesSurface().parse(orjson.dumps(body))
    assert (err.value.status, err.value.code, err.value.param) == (400, code, param)


def test_a_late_error_is_the_streams_own_error_event() -> None:
    body = orjson.dumps({"error": {"message": "Queue timed out.", "type": "x", "param": None, "code": "queue_timeout"}})
    assert SSEDecoder().feed(ResponsesSurface().stream_error(503, body)) == [
        {"type": "error", "code": "queue_timeout", "message": "Queue timed out.", "param": None, "sequence_number": 0}
    ]


async def test_prepare_resolves_previous_response_id_for_the_callers_team() -> None:
    surface = ResponsesSurface()
    await _prior(surface, team="red")
    req = surface.parse(orjson.dumps({"model": "kimi", "input": "second", "previous_response_id": "resp_prior"}))
    req.team = "red"
    await surface.prepare(req)
    run = req.native
    assert isinstance(run, ResponsesRun) and run.team == "red" and run.response_id.startswith("resp_")
    assert run.prior == [*PRIOR_INPUT, *PRIOR_OUTPUT]
    assert [m["content"] for m in req.prompt["messages"]] == ["first", "one", "second"], "the whole conversation"
    for team, rid in (("blue", "resp_prior"), ("red", "resp_gone")):  # another team's is not found, like none
        other = surface.parse(orjson.dumps({"model": "kimi", "input": "x", "previous_response_id": rid}))
        other.team = team
        with pytest.raises(GatewayError) as err:
            await surface.prepare(other)
        assert (err.value.status, err.value.code, err.value.param) == (
            404,
            "previous_response_not_found",
            "previous_response_id",
        )


async def test_prepare_without_a_previous_response() -> None:
    surface = ResponsesSurface()
    req = surface.parse(b'{"model": "kimi", "input": "hi"}')
    await surface.prepare(req)
    assert isinstance(req.native, ResponsesRun) and req.native.prior is None and req.native.team == ""


async def test_upstream_translated(app: tuple[ResponsesSurface, Any, Any]) -> None:
    surface, _, _ = app
    req = surface.parse(b'{"model": "kimi", "input": "hi", "stream": true}')
    await surface.prepare(req)
    call = surface.upstream(req, Target("chat", "served/kimi", 2))
    sent = orjson.loads(call.body)
    assert call.path == "/v1/chat/completions" and (sent["model"], sent["routed_dp_rank"]) == ("served/kimi", 2)
    assert isinstance(call.relay, TranslatedRelay) and call.relay.translator is not None
    assert surface.running[req.native.response_id] is req.native, "a stream can be cancelled while it runs"
    assert req.native.relay is call.relay and req.native.req.chat["model"] == "kimi"


async def test_upstream_passthrough_expands_the_stored_conversation(app: tuple[ResponsesSurface, Any, Any]) -> None:
    surface, _, _ = app
    await _prior(surface)
    body = {"model": "native", "input": "second", "previous_response_id": "resp_prior", "store": True}
    req = surface.parse(orjson.dumps(body))
    await surface.prepare(req)
    call = surface.upstream(req, Target("own", "served/native", None))
    assert call.path == "/v1/responses" and isinstance(call.relay, NativeRelay) and call.relay.kind == "responses"
    sent = orjson.loads(call.body)
    assert "previous_response_id" not in sent and sent["model"] == "served/native" and "routed_dp_rank" not in sent
    assert sent["input"] == [
        *PRIOR_INPUT,
        *PRIOR_OUTPUT,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]},
    ]
    assert call.relay.done is not None
    await call.relay.done({"id": "resp_upstream", "status": "completed", "output": []}, True)
    stored = await surface.store.get("resp_upstream")
    assert stored is not None and stored.status == "completed" and stored.input_items == sent["input"]
    await call.relay.done(None, False)  # a broken stream: nothing to store
    assert len(surface.store) == 2  # type: ignore[arg-type]


def test_cancel_local_of_nothing_running() -> None:
    assert ResponsesSurface().cancel_local("resp_nothing") is False


# ---- through the app ----


async def test_a_whole_answer_is_stored_and_continued(
    app: tuple[ResponsesSurface, Any, Any], upstream: FakeUpstream
) -> None:
    surface, _, client = app
    first = await client.post("/v1/responses", json={"model": "kimi", "input": "hi"})
    assert first.status_code == 200
    response = Response.model_validate(first.json())
    assert response.output_text == "Hello, world!" and response.status == "completed"
    stored = await surface.store.get(response.id, TEAM)
    assert stored is not None and stored.status == "completed" and stored.response == first.json()
    again = await client.post(
        "/v1/responses", json={"model": "kimi", "input": "and then?", "previous_response_id": response.id}
    )
    assert again.status_code == 200 and again.json()["previous_response_id"] == response.id
    assert [m["content"] for m in upstream.requests[-1]["body"]["messages"]] == ["hi", "Hello, world!", "and then?"]


async def test_store_false_is_not_stored(app: tuple[ResponsesSurface, Any, Any]) -> None:
    surface, _, client = app
    answer = await client.post("/v1/responses", json={"model": "kimi", "input": "hi", "store": False})
    assert answer.status_code == 200 and await surface.store.get(answer.json()["id"], TEAM) is None


async def test_a_stream_is_stored_in_progress_then_final(app: tuple[ResponsesSurface, Any, Any]) -> None:
    surface, starlette, _ = app
    seen: list[str | None] = []
    store_put = surface.store.put

    async def put(record: StoredResponse) -> None:
        seen.append(record.status)
        await store_put(record)

    surface.store.put = put  # type: ignore[method-assign]  # watch the real store's writes in order
    status, chunks = await call_and_leave(
        starlette, "/v1/responses", {"model": "kimi", "input": "hi", "stream": True}, 10**6
    )
    events = SSEDecoder().feed(b"".join(chunks))
    assert status == 200 and events[-1]["type"] == "response.completed"
    assert seen == ["in_progress", "completed"]
    stored = await surface.store.get(events[-1]["response"]["id"], TEAM)
    assert stored is not None and stored.response["output"][0]["content"][0]["text"] == "Hello, world!"
    assert surface.running == {}


async def test_a_running_stream_cancelled_on_this_replica(app: tuple[ResponsesSurface, Any, Any]) -> None:
    surface, starlette, _ = app
    body = {"model": "kimi", "input": "slow", "stream": True}  # the scripted upstream streams for seconds
    task = asyncio.ensure_future(call_and_leave(starlette, "/v1/responses", body, 10**6))
    async with asyncio.timeout(5):
        while not surface.running:
            await asyncio.sleep(0.01)
    (rid,) = surface.running
    async with asyncio.timeout(5):
        while (record := await surface.store.get(rid, TEAM)) is None or record.status != "in_progress":
            await asyncio.sleep(0.01)
    assert surface.cancel_local(rid) is True
    status, chunks = await asyncio.wait_for(task, 5)
    events = SSEDecoder().feed(b"".join(chunks))
    assert status == 200 and [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "cancelled"
    stored = await surface.store.get(rid, TEAM)
    assert stored is not None and stored.status == "cancelled" and surface.running == {}


async def test_the_store_is_memory_without_redis(app: tuple[ResponsesSurface, Any, Any]) -> None:
    surface, starlette, _ = app
    assert isinstance(surface.store, MemoryResponseStore) and starlette.state.gateway.responses is surface


@pytest.mark.redis
async def test_with_redis_the_store_is_shared_by_replicas(upstream: FakeUpstream, redis_url: str) -> None:
    surface = ResponsesSurface()
    cfg = _config(upstream.url, redis_url=redis_url)
    async with running(cfg, surfaces=[CHAT, surface]) as (_, client):
        assert isinstance(surface.store, RedisResponseStore)
        answer = await client.post("/v1/responses", json={"model": "kimi", "input": "hi"})
        other_replica = RedisResponseStore.from_url(redis_url)
        try:
            stored = await other_replica.get(answer.json()["id"], TEAM)
        finally:
            await other_replica.close()
    assert stored is not None and stored.status == "completed"
