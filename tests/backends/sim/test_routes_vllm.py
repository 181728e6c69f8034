"""backends/sim/routes_vllm.py: vLLM's own routes on the twin (``/version``, ``/load``, ``/v1/models``,
``/metrics``) in-process, and :class:`VllmDialect` around a small echo app: the DP rank taken from the
header (a body's rank dropped), bodies it cannot parse passed through, a client that leaves still
seen, errors re-enveloped with their length. Against vLLM's source: tests/backends/test_twin_vllm.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message

from backends.sim.routes_vllm import VLLM_VERSION, VllmDialect, error_envelope
from tests.backends.sim.twin_asgi import USER, twin_app


async def _echo(request: Request) -> Response:
    raw = await request.body()
    status = int(request.query_params.get("status", 200))
    if request.query_params.get("text"):
        return PlainTextResponse(raw.decode(), status_code=status)
    return Response(raw, status_code=status, media_type="application/json")


async def _error(request: Request) -> Response:
    return JSONResponse(
        {"object": "error", "message": "nope", "type": "BadRequestError", "param": "x", "code": 422}, status_code=422
    )


def _client() -> httpx.AsyncClient:
    app = Starlette(
        routes=[
            Route("/echo", _echo, methods=["POST", "GET"]),
            Route("/_twin/echo", _echo, methods=["POST"]),
            Route("/error", _error),
        ]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=VllmDialect(app)), base_url="http://vllm")


def test_error_envelope_nests_sglangs_flat_error_and_leaves_anything_else() -> None:
    flat = {"object": "error", "message": "bad", "type": "BadRequestError", "param": None, "code": 400}
    assert error_envelope(flat) == {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    assert error_envelope({"object": "error", "message": "m", "type": "", "code": None}) == {
        "error": {"message": "m", "type": "BadRequestError", "param": None, "code": 400}
    }
    for other in ({"error": {"message": "x"}}, {"object": "error"}, [1], "text"):
        assert error_envelope(other) == other


async def test_the_rank_header_becomes_the_twins_body_field_and_a_body_rank_is_dropped() -> None:
    async with _client() as c:
        body = {"a": 1, "routed_dp_rank": 0, "data_parallel_rank": 0}
        got = (await c.post("/echo", json=body, headers={"X-data-parallel-rank": "3"})).json()
        assert got == {"a": 1, "routed_dp_rank": 3}
        assert (await c.post("/echo", json=body)).json() == {"a": 1}
        assert (await c.post("/echo", json=body, headers={"x-data-parallel-rank": "two"})).json() == {"a": 1}


async def test_a_body_it_cannot_rewrite_passes_unchanged_and_twin_routes_are_left_alone() -> None:
    async with _client() as c:
        assert (await c.post("/echo?text=1", content=b"{not json")).text == "{not json"
        assert (await c.post("/echo", json=[1, 2], headers={"x-data-parallel-rank": "1"})).json() == [1, 2]
        twin_only = await c.post("/_twin/echo", json={"routed_dp_rank": 5}, headers={"x-data-parallel-rank": "1"})
        assert twin_only.json() == {"routed_dp_rank": 5}


async def test_an_error_answer_is_re_enveloped_with_a_content_length_that_fits() -> None:
    async with _client() as c:
        r = await c.get("/error")
        assert r.status_code == 422 and r.json() == {
            "error": {"message": "nope", "type": "BadRequestError", "param": "x", "code": 422}
        }
        assert int(r.headers["content-length"]) == len(r.content)
        text = await c.post("/echo?status=500&text=1", content=b"plain failure")
        assert text.status_code == 500 and text.text == "plain failure"  # not JSON: unchanged
        assert int(text.headers["content-length"]) == len(b"plain failure")


async def test_a_body_cut_by_a_leaving_client_is_replayed_then_the_disconnect() -> None:
    seen: list[Message] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(await receive())
        seen.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    parts: list[Message] = [
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return parts.pop(0)

    async def send(message: Message) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"x-data-parallel-rank", b"1")]}
    await asyncio.wait_for(VllmDialect(app)(scope, receive, send), 5)
    assert seen == [{"type": "http.request", "body": b'{"a":', "more_body": False}, {"type": "http.disconnect"}]


async def test_the_vllm_twins_own_routes() -> None:
    async with twin_app(engine="vllm", model="org/m") as (_, t, c):
        assert (await c.get("/version")).json() == {"version": VLLM_VERSION}
        models = (await c.get("/v1/models")).json()["data"]
        assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models] == [("org/m", "vllm", 262_144)]
        assert models[0]["permission"][0]["object"] == "model_permission"
        assert (await c.get("/load")).json() == {"server_load": 0}
        req = {"messages": USER, "max_tokens": 3000, "ignore_eos": True, "stream": True}
        running = asyncio.create_task(c.post("/v1/chat/completions", json=req))
        while not t.live:
            await asyncio.sleep(0.01)
        assert (await c.get("/load")).json() == {"server_load": 1}
        t.abort(next(iter(t.live)))
        assert (await running).status_code == 200
        await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2})
        text = (await c.get("/metrics")).text
        assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="org/m"} 1.0' in text
        assert "sglang:" not in text


@pytest.mark.parametrize("path", ["/get_server_info", "/v1/loads", "/generate", "/"])
async def test_the_vllm_twin_serves_no_sglang_route(path: str) -> None:
    async with twin_app(engine="vllm") as (_, _t, c):
        assert (await c.get(path)).status_code == 404


async def test_the_vllm_twins_errors_are_vllms_envelope() -> None:
    async with twin_app(engine="vllm") as (_, _t, c):
        r = await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 300_000})
        assert r.status_code == 400 and set(r.json()) == {"error"}
        assert r.json()["error"]["code"] == 400 and "maximum context length" in r.json()["error"]["message"]
        assert orjson.loads(r.content) == r.json() and int(r.headers["content-length"]) == len(r.content)
