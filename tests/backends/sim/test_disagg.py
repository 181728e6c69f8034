"""backends/sim/disagg.py: the :class:`Disaggregated` middleware in-process, one role at a time, with the
prefill's bootstrap server (or a bare :class:`Rooms` one) on real loopback: field checks, the info
routes' patch, a prefill answer held until its room is taken (or refused, timed out, or its client
gone), a decode leg's fetch, transfer time, cached tokens and failures. Both roles end to end over
real HTTP: tests/pd/test_twin_disagg.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from backends.sim.disagg import NO_ROOM, Disaggregated, _opening, check_fields, disagg_middleware
from backends.sim.disagg_rooms import Rooms
from backends.sim.profiles import get_profile
from backends.sim.testing import free_port
from tests.backends.sim.twin_asgi import USER, sse_data, twin_app

FIELDS = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 8998, "bootstrap_room": 5}


def _chat(room: int | None, port: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": USER, "max_tokens": 16, **extra}
    if room is not None:
        body.update(bootstrap_host="127.0.0.1", bootstrap_port=port, bootstrap_room=room)
    return body


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"bootstrap_host": ""}, "bootstrap_host must be a host name"),
        ({"bootstrap_host": None}, "bootstrap_host must be a host name"),
        ({"bootstrap_port": True}, "bootstrap_port must be a port number"),
        ({"bootstrap_port": 65536}, "bootstrap_port must be a port number"),
        ({"bootstrap_port": "8998"}, "bootstrap_port must be a port number"),
        ({"bootstrap_room": -1}, "bootstrap_room must be a 63-bit"),
        ({"bootstrap_room": 1 << 63}, "bootstrap_room must be a 63-bit"),
        ({"bootstrap_room": False}, "bootstrap_room must be a 63-bit"),
        ({"routed_dp_rank": "1"}, "routed_dp_rank must be an integer"),
        ({"disagg_prefill_dp_rank": 1.5}, "disagg_prefill_dp_rank must be an integer"),
    ],
)
def test_check_fields_names_each_malformed_field(change: dict[str, Any], problem: str) -> None:
    problems = check_fields({**FIELDS, **change})
    assert len(problems) == 1 and problems[0].startswith(problem)


def test_check_fields_accepts_sglangs_types() -> None:
    assert check_fields({**FIELDS, "bootstrap_room": (1 << 63) - 1, "routed_dp_rank": None}) == []
    assert check_fields({**FIELDS, "routed_dp_rank": 3, "disagg_prefill_dp_rank": 0}) == []


def test_the_opening_is_the_prompts_first_48_characters() -> None:
    assert _opening({"messages": [{"role": "user", "content": "x" * 60}]}) == "x" * 48
    assert _opening({"input": "hello"}) == "hello" and _opening({"prompt": ["abc"]}) == "abc"
    assert _opening({}) == ""


def test_the_middleware_for_a_mode_and_its_kv_bytes_per_token() -> None:
    prof = get_profile("b300-dp8-fp8")
    mw = disagg_middleware("decode", 9000, "0.0.0.0", prof, 0.5)
    assert mw.cls is Disaggregated
    assert mw.kwargs == {
        "mode": "decode",
        "bootstrap_port": 9000,
        "host": "0.0.0.0",
        "kv_bytes_per_token": prof.kv_bytes_per_token_per_gpu * 8,
        "time_scale": 0.5,
    }
    with pytest.raises(ValueError, match="null, prefill or decode, got 'both'"):
        disagg_middleware("both", 9000, "127.0.0.1", prof, 1.0)


@asynccontextmanager
async def prefill(**kw: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient, int]]:
    port = free_port()
    async with twin_app(disaggregation_mode="prefill", disaggregation_bootstrap_port=port, **kw) as (app, _t, c):
        yield app, c, port


def _layer(app: Any) -> Disaggregated:
    """The app's :class:`Disaggregated` layer (under Starlette's error middleware and ``RecordRequests``)."""
    layer = app.middleware_stack
    while not isinstance(layer, Disaggregated):
        layer = layer.app
    return layer


async def _state(c: httpx.AsyncClient) -> dict[str, Any]:
    return (await c.get("/_twin/disagg")).json()  # type: ignore[no-any-return]


async def test_a_request_without_a_room_or_with_bad_fields_is_refused_and_recorded() -> None:
    async with prefill() as (_, c, port):
        r = await c.post("/v1/chat/completions", json=_chat(None, port))
        assert r.status_code == 400 and r.json()["message"] == NO_ROOM
        bad = await c.post("/generate", json={"text": "hi", **FIELDS, "bootstrap_port": 0})
        assert bad.status_code == 400 and "bootstrap_port must be a port number" in bad.json()["message"]
        state = await _state(c)
        assert state["outcomes"] == {"refused": 2} and state["pending"] == 0 and state["bootstrap_port"] == port
        assert [s["path"] for s in state["seen"]] == ["/v1/chat/completions", "/generate"]
        assert (
            state["seen"][0]["problems"] == [NO_ROOM.strip()] and state["seen"][0]["opening"] == USER[0]["content"][:48]
        )


async def test_a_body_that_is_not_a_json_object_goes_to_the_twins_own_route() -> None:
    async with prefill() as (_, c, _port):
        r = await c.post("/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON decode error" in r.json()["message"]
        assert (await _state(c))["seen"] == []


async def test_the_info_routes_report_the_role_with_a_length_that_fits() -> None:
    async with prefill() as (_, c, port):
        info = await c.get("/get_server_info")
        assert info.json()["disaggregation_mode"] == "prefill"
        assert info.json()["disaggregation_bootstrap_port"] == port
        assert info.json()["disaggregation_transfer_backend"] == "mooncake"
        assert int(info.headers["content-length"]) == len(info.content)
        model = (await c.get("/model_info")).json()
        assert model["disaggregation_mode"] == "prefill" and "disaggregation_bootstrap_port" not in model
        assert (await c.get("/health")).status_code == 200  # other routes untouched


async def test_a_prefill_answers_one_token_once_its_room_is_taken() -> None:
    async with prefill() as (_, c, port), httpx.AsyncClient(trust_env=False) as kv:
        leg = asyncio.create_task(c.post("/v1/chat/completions", json=_chat(11, port, max_tokens=500)))
        fetched = await kv.get(f"http://127.0.0.1:{port}/kv/11", params={"wait": 5})
        r = await leg
        usage = r.json()["usage"]
        assert r.status_code == 200 and usage["completion_tokens"] == 1
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert fetched.json() == {
            "room": 11,
            "tokens": usage["prompt_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        }
        state = await _state(c)
        assert state["outcomes"] == {"handed_over": 1} and state["handed_over"] == 1


async def test_a_prefill_generate_runs_one_new_token_too() -> None:
    async with prefill() as (_, c, port), httpx.AsyncClient(trust_env=False) as kv:
        body = {"text": "hello " * 30, "sampling_params": {"max_new_tokens": 99}, **FIELDS, "bootstrap_port": port}
        leg = asyncio.create_task(c.post("/generate", json=body))
        assert (await kv.get(f"http://127.0.0.1:{port}/kv/5", params={"wait": 5})).status_code == 200
        assert (await leg).json()["meta_info"]["completion_tokens"] == 1


async def test_a_prefill_whose_room_is_never_taken_times_out_and_fails_the_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "0.05")
    async with prefill() as (_, c, port), httpx.AsyncClient(trust_env=False) as kv:
        r = await c.post("/v1/chat/completions", json=_chat(12, port))
        assert (
            r.status_code == 500 and r.json()["message"] == "Request 12 timed out after 0.05s in KVPoll.Bootstrapping"
        )
        assert (await kv.get(f"http://127.0.0.1:{port}/kv/12")).status_code == 410
        assert (await _state(c))["outcomes"] == {"bootstrap_timeout": 1}


async def test_a_prefill_the_twin_refuses_is_answered_as_refused_and_fails_the_room() -> None:
    async with prefill() as (_, c, port), httpx.AsyncClient(trust_env=False) as kv:
        r = await c.post("/v1/chat/completions", json=_chat(13, port, routed_dp_rank=4))  # tiny has one rank
        assert r.status_code == 400 and "out of range" in r.json()["message"]
        assert (await kv.get(f"http://127.0.0.1:{port}/kv/13")).status_code == 410
        assert (await _state(c))["outcomes"] == {"prefill_refused": 1}


async def test_a_prefill_whose_client_leaves_while_held_fails_the_room() -> None:
    async with prefill() as (app, c, port), httpx.AsyncClient(trust_env=False) as kv:
        raw = orjson.dumps(_chat(14, port))
        leave = asyncio.Event()
        delivered = False
        sent: list[Message] = []

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await leave.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1),
            "server": ("twin", 80),
            "state": {},
        }
        call = asyncio.create_task(app(scope, receive, send))
        rooms = _layer(app).rooms
        while 14 not in rooms.rooms or not rooms.rooms[14].ready.is_set():  # the twin answered: the leg is held
            await asyncio.sleep(0.01)
        leave.set()
        await asyncio.wait_for(call, 5)
        assert sent == []  # nothing sent to a client that left
        assert (await kv.get(f"http://127.0.0.1:{port}/kv/14")).status_code == 410
        assert (await _state(c))["outcomes"] == {"client_left": 1}


@asynccontextmanager
async def bootstrap() -> AsyncIterator[tuple[Rooms, int]]:
    rooms, port = Rooms(), free_port()
    await rooms.start("127.0.0.1", port)
    try:
        yield rooms, port
    finally:
        await rooms.stop()


async def test_a_decode_fetches_its_room_then_generates_with_the_prefills_cached_tokens() -> None:
    async with bootstrap() as (rooms, port), twin_app(disaggregation_mode="decode") as (_, _t, c):
        rooms.computed(21, 120, 77)
        r = await c.post("/v1/chat/completions", json=_chat(21, port))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 77
        assert int(r.headers["content-length"]) == len(r.content)
        rooms.computed(22, 120, 33)
        body = _chat(22, port, stream=True, stream_options={"include_usage": True})
        stream = await c.post("/v1/chat/completions", json=body)
        usage = orjson.loads(sse_data(stream.text)[-2])["usage"]
        assert usage["completion_tokens"] == 16 and usage["prompt_tokens_details"]["cached_tokens"] == 33
        assert (await _state(c))["outcomes"] == {"generated": 2}


async def test_a_decode_whose_room_failed_answers_500() -> None:
    async with bootstrap() as (rooms, port), twin_app(disaggregation_mode="decode") as (_, t, c):
        rooms.fail(23)
        r = await c.post("/v1/chat/completions", json=_chat(23, port))
        assert r.status_code == 500 and r.json()["type"] == "InternalServerError"
        assert r.json()["message"] == "KV transfer failed for room 23: room 23 failed on the prefill server"
        assert (await _state(c))["outcomes"] == {"kv_failed": 1}
        assert not any("rid" in seen for seen in t.requests)  # the twin generated nothing


async def test_a_decode_that_gets_no_kv_in_time_answers_500(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "0.05")
    async with bootstrap() as (_, port), twin_app(disaggregation_mode="decode") as (_, _t, c):
        r = await c.post("/v1/chat/completions", json=_chat(24, port))
        assert r.status_code == 500 and r.json()["message"] == "Request 24 timed out after 0.05s waiting for KV"


async def test_a_decode_whose_prefill_is_unreachable_answers_500_after_its_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "1")  # no heartbeat wait
    async with twin_app(disaggregation_mode="decode") as (_, _t, c):
        r = await c.post("/v1/chat/completions", json=_chat(25, free_port()))
        assert r.status_code == 500 and "unreachable: ConnectError" in r.json()["message"]


async def _echo(request: Request) -> Response:
    return JSONResponse({"usage": {"cached_tokens": 0}, "got": orjson.loads(await request.body())})


async def test_a_decode_waits_the_transfer_time_of_the_rooms_kv() -> None:
    inner = Starlette(routes=[Route("/v1/completions", _echo, methods=["POST"])])
    # 10 tokens x 10 MB over 1 GB/s at time scale 1: 0.1 s
    app = Disaggregated(inner, "decode", kv_bytes_per_token=10_000_000, link_gb_s=1.0, time_scale=1.0)
    async with bootstrap() as (rooms, port):
        rooms.computed(31, 10, 4)
        body = {"prompt": "p", "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": 31}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://d") as c:
            t0 = time.monotonic()
            r = await c.post("/v1/completions", json=body)
            waited = time.monotonic() - t0
    assert r.json() == {"usage": {"cached_tokens": 4}, "got": body}
    assert 0.1 <= waited < 1.0
    assert app.state()["outcomes"] == {"generated": 1} and app.state()["bootstrap_port"] is None
