"""backends/sim/httpio.py: the HTTP plumbing every twin route shares: SGLang's JSON and error
shapes, the body and ``stream_options`` checks, ``max_tokens`` aliases, the finish reason, and
``run_plan`` (submit, wait, a duplicate id, a client that leaves)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from starlette.responses import Response

from backends.sim import responses as R
from backends.sim.engine import EngineEvent
from backends.sim.httpio import (
    error_response,
    finish_of,
    json_body,
    json_response,
    max_tokens_of,
    run_plan,
    stream_options,
    twin_of_request,
    validation_error,
)
from backends.sim.planner import plan_chat
from backends.sim.runtime import ApiError, Plan, Twin
from backends.sim.server import create_app
from tests.backends.sim.twin_asgi import USER, asgi_request

JSON = {"content-type": "application/json"}


@asynccontextmanager
async def started() -> AsyncIterator[Twin]:
    twin: Twin = create_app("tiny", time_scale=0.02, abort_delay_s=0.01).state.twin
    await twin.start()
    try:
        yield twin
    finally:
        await twin.stop()


def _json(r: Response) -> Any:
    return orjson.loads(bytes(r.body))


def test_json_response_is_orjson_with_its_status() -> None:
    r = json_response({"a": [1, None]}, 201)
    assert (r.status_code, r.media_type, bytes(r.body)) == (201, "application/json", b'{"a":[1,null]}')


def test_error_response_is_sglangs_flat_error_with_the_errors_status() -> None:
    r = error_response(ApiError("no such thing", 404, "NotFoundError"))
    assert r.status_code == 404
    assert _json(r) == {
        "object": "error",
        "message": "no such thing",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }
    v = validation_error("bad field")
    assert v.status_code == 400 and _json(v)["type"] == "Bad Request" and _json(v)["message"] == "bad field"


async def test_json_body_takes_a_json_object_with_or_without_a_charset() -> None:
    body = await json_body(asgi_request(b'{"x": 1}', headers={"content-type": "Application/JSON; charset=utf-8"}))
    assert body == {"x": 1}


@pytest.mark.parametrize(
    ("raw", "headers", "match"),
    [
        (b'{"x": 1}', {"content-type": "text/plain"}, "Only 'application/json' is allowed"),
        (b'{"x": 1}', {}, "Unsupported Media Type"),
        (b"{not json", JSON, "JSON decode error"),
        (b"[1, 2]", JSON, "valid dictionary"),
    ],
)
async def test_json_body_refuses_what_sglang_refuses(raw: bytes, headers: dict[str, str], match: str) -> None:
    with pytest.raises(ApiError, match=match) as err:
        await json_body(asgi_request(raw, headers=headers))
    assert err.value.status == 400 and err.value.err_type == "Bad Request"


def test_stream_options_flags_and_a_malformed_one() -> None:
    assert stream_options({}) == (False, False)
    assert stream_options({"stream_options": None}) == (False, False)
    assert stream_options({"stream_options": {"include_usage": True}}) == (True, False)
    assert stream_options({"stream_options": {"continuous_usage_stats": 1}}) == (False, True)
    with pytest.raises(ApiError, match="stream_options must be an object"):
        stream_options({"stream_options": [True]})


def test_max_tokens_of_takes_the_first_name_that_is_set() -> None:
    names = ("max_completion_tokens", "max_tokens")
    assert max_tokens_of({"max_tokens": 5, "max_completion_tokens": 7}, *names) == 7
    assert max_tokens_of({"max_tokens": 5, "max_completion_tokens": None}, *names) == 5
    assert max_tokens_of({"max_tokens": 0}, *names) == 0  # zero is set
    assert max_tokens_of({}, *names) is None


def _plan(finish: str) -> Plan:
    return Plan("p", 1, 1, 1, "", "x", None, finish, "x")


def _event(reason: Any) -> EngineEvent:
    return EngineEvent(kind="finished", rid="r", time=1.0, finish_reason=reason)


def test_finish_of_reports_the_plans_end_unless_aborted() -> None:
    assert finish_of(_plan("stop"), _event("stop")) == ("stop", R.KIMI_EOS_TOKEN_ID)
    assert finish_of(_plan("length"), _event("length")) == ("length", None)
    assert finish_of(_plan("tool_calls"), _event("stop")) == ("tool_calls", None)
    assert finish_of(_plan("stop"), _event("abort")) == ("abort", None)


async def test_run_plan_waits_for_the_end_of_a_whole_answer_and_records_the_request() -> None:
    async with started() as t:
        tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
        body = {"rid": "whole-1", "messages": USER, "tools": tools, "max_tokens": 400}
        plan = plan_chat(t, body, 400, thinking=False)
        ran = await run_plan(t, asgi_request(twin=t), body, plan)
        assert not isinstance(ran, Response)
        live, rid, model, _created, done = ran
        assert (rid, model) == ("whole-1", t.model) and done is not None and done.kind == "finished"
        assert done.completion_tokens == plan.output_tokens and live.tool_calls == plan.tool_calls
        seen = t.requests[-1]
        assert seen["rid"] == "whole-1" and seen["path"] == "/v1/chat/completions" and seen["stream"] is False
        assert seen["tool"] == "read_file" and seen["tools"] == ["read_file"] and seen["finish"] == "tool_calls"
        assert twin_of_request(asgi_request(twin=t)) is t


async def test_run_plan_returns_after_the_first_token_of_a_stream() -> None:
    async with started() as t:
        body = {"messages": USER, "max_tokens": 3000, "ignore_eos": True, "stream": True, "model": "alias"}
        ran = await run_plan(t, asgi_request(twin=t), body, plan_chat(t, body, 3000, thinking=False))
        assert not isinstance(ran, Response)
        live, rid, model, _created, done = ran
        assert done is None and model == "alias" and len(rid) == 32 and rid in t.live
        assert live.first.done() and not live.done.done()
        t.abort(rid)


async def test_run_plan_answers_a_duplicate_request_id_with_sglangs_400() -> None:
    async with started() as t:
        body = {"rid": "twice", "messages": USER, "max_tokens": 3000, "ignore_eos": True, "stream": True}
        plan = plan_chat(t, body, 3000, thinking=False)
        assert not isinstance(await run_plan(t, asgi_request(twin=t), body, plan), Response)
        again = await run_plan(t, asgi_request(twin=t), body, plan)
        assert isinstance(again, Response) and again.status_code == 400
        assert _json(again)["message"] == "Duplicate request ID: twice"
        t.abort("twice")


async def test_run_plan_answers_499_and_aborts_when_the_client_leaves_before_the_end() -> None:
    async with started() as t:
        body = {"rid": "gone", "messages": USER, "max_tokens": 20000, "ignore_eos": True}
        plan = plan_chat(t, body, 20000, thinking=False)
        ran = await asyncio.wait_for(run_plan(t, asgi_request(twin=t, disconnected=True), body, plan), 5)
        assert isinstance(ran, Response) and ran.status_code == 499
        assert "gone" not in t.live
        assert (
            t.metrics.registry.get_sample_value(
                "sglang:num_aborted_requests_total", {"model_name": t.model, "engine_type": "unified"}
            )
            == 1
        )
