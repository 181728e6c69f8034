"""/v1/responses and /v1/messages through ``python -m gateway.cli serve`` in front of twins, with the
official SDKs, each once in passthrough mode (the twin serves the route; ``surfaces: auto``) and
once translated (a twin started as an older, chat-only build: ``routes="chat"``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
import yaml

from backends.sim.testing import run_twin, twin_of
from gateway.config.schema import hash_key
from tests.gateway.observability.test_telemetry import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, OtlpReceiver
from tests.harness import run_gateway

pytestmark = pytest.mark.slow  # real processes: a gateway and twins per mode
KEY, TIGHT_KEY, ADMIN = "k-default", "k-tight", "adm1n"
TOOLS = [
    {
        "type": "function",
        "name": "read_file",
        "description": "Read a file of the project.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    }
]
A_TOOLS = [
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]},
    }
]
UPSTREAM = {
    "passthrough": {"responses": "/v1/responses", "messages": "/v1/messages"},
    "translate": {"responses": "/v1/chat/completions", "messages": "/v1/chat/completions"},
}


def write_config(path: Path, twins: list[str], **extra: Any) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "kimi": {
                        "backends": [{"url": u, "name": f"twin-{i}"} for i, u in enumerate(twins)],
                        "surfaces": {"responses": "auto", "messages": "auto"},
                    }
                },
                "aliases": {"claude-*": "kimi", "gpt-*": "kimi"},
                "teams": {
                    "default": {"max_concurrency": 16, "max_queue": 64},
                    "tight": {"max_concurrency": 1, "max_queue": 1},
                },
                "keys": [
                    {"sha256": hash_key(KEY), "team": "default"},
                    {"sha256": hash_key(TIGHT_KEY), "team": "tight"},
                ],
                "health": {"interval_s": 0.5, "load_interval_s": 0.5},
                **extra,
            }
        )
    )
    return str(path)


@pytest.fixture(scope="module", params=["passthrough", "translate"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver().running() as r:
        yield r


@pytest.fixture(scope="module")
def stack(mode: str, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(gateway URL, twin URL): one twin, native routes or chat only."""
    routes = "all" if mode == "passthrough" else "chat"
    with run_twin(
        "tiny", time_scale=0.2, model="kimi", stream_interval_s=0.01, abort_delay_s=0.0, routes=routes
    ) as twin:
        cfg = write_config(tmp_path_factory.mktemp(mode) / "c.yaml", [twin])
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with run_gateway("--config", cfg, "--admin-token", ADMIN, env=env) as gw:
            yield gw, twin


def upstream_paths(twin: str, since: int) -> list[str]:
    return [e["path"] for e in httpx.get(twin + "/_twin/requests").json()[since:] if e.get("method") == "POST"]


def seen(twin: str) -> int:
    return len(httpx.get(twin + "/_twin/requests").json())


def test_responses_create_tool_call_then_previous_response_id(stack: tuple[str, str], mode: str) -> None:
    gw, twin = stack
    before = seen(twin)
    client = openai.OpenAI(base_url=gw + "/v1", api_key=KEY)
    first = client.responses.create(model="kimi", input="Look at this project, then describe it.", tools=TOOLS)
    call = next(o for o in first.output if o.type == "function_call")
    assert call.name == "read_file" and "path" in call.arguments and first.status == "completed"
    second = client.responses.create(
        model="gpt-5-codex",
        previous_response_id=first.id,
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "# demo\nA small project."}],
    )
    assert second.output_text and second.status == "completed"
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0  # turn 2 hit the cache
    assert client.responses.retrieve(second.id).output_text == second.output_text
    assert upstream_paths(twin, before) == [UPSTREAM[mode]["responses"]] * 2


def test_responses_stream_text_and_function_call(stack: tuple[str, str], mode: str) -> None:
    gw, _ = stack
    client = openai.OpenAI(base_url=gw + "/v1", api_key=KEY)
    with client.responses.stream(model="kimi", input="What is in this project?", tools=TOOLS) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    call = next(o for o in final.output if o.type == "function_call")
    with client.responses.stream(
        model="kimi",
        previous_response_id=final.id,
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "# demo"}],
    ) as stream:
        kinds = [e.type for e in stream]
        text = stream.get_final_response().output_text
    assert "response.output_text.delta" in kinds and text


def test_messages_create_stream_and_count_tokens(stack: tuple[str, str], mode: str) -> None:
    gw, twin = stack
    before = seen(twin)
    client = anthropic.Anthropic(base_url=gw, api_key=KEY)  # x-api-key
    first = client.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=4096,
        tools=A_TOOLS,
        messages=[{"role": "user", "content": "Look at the project."}],
    )
    assert first.stop_reason == "tool_use"
    use = next(c for c in first.content if c.type == "tool_use")
    assert use.name == "Read" and "file_path" in use.input
    history = [
        {"role": "user", "content": "Look at the project."},
        {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "# demo"}]},
    ]
    bearer = anthropic.Anthropic(base_url=gw, auth_token=KEY)  # Authorization: Bearer
    with bearer.messages.stream(model="kimi", max_tokens=4096, tools=A_TOOLS, messages=history) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[-1].type == "text" and final.content[-1].text
    assert final.usage.cache_read_input_tokens and final.usage.cache_read_input_tokens > 0
    with bearer.messages.stream(
        model="kimi", max_tokens=4096, tools=A_TOOLS, messages=[{"role": "user", "content": "Read the README."}]
    ) as stream:
        events = [e.type for e in stream]
        tool = stream.get_final_message()
    assert "input_json" in events and tool.stop_reason == "tool_use"
    counted = client.messages.count_tokens(model="kimi", messages=history, tools=A_TOOLS)
    assert counted.input_tokens > 10
    assert upstream_paths(twin, before) == [UPSTREAM[mode]["messages"]] * 3


def test_errors_in_each_surface_envelope(stack: tuple[str, str]) -> None:
    gw, _ = stack
    r = httpx.post(
        gw + "/v1/messages?beta=true",
        json={"model": "kimi", "max_tokens": 5, "messages": []},
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(gw + "/v1/messages", json={"model": "kimi", "max_tokens": 5, "messages": []})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(
        gw + "/v1/responses",
        json={"model": "kimi", "input": "x", "previous_response_id": "resp_nope"},
        headers={"authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "previous_response_not_found"
    assert httpx.get(gw + "/v1/models").status_code == 401
    models = httpx.get(gw + "/v1/models", headers={"authorization": f"Bearer {KEY}"}).json()["data"]
    assert models[0]["id"] == "kimi" and models[0]["max_model_len"] == 262144
    assert httpx.head(gw + "/").status_code == 200


def test_upstream_errors_in_each_surface_envelope(stack: tuple[str, str]) -> None:
    """A request longer than the context: since issue 14 the gateway refuses it itself (400
    ``context_length_exceeded``: it knows the window), before the twin would (SGLang's flat 400);
    each surface answers it in its own envelope. (An engine 400 relayed:
    tests/gateway/observability/test_telemetry.py.)"""
    gw, _ = stack
    huge = 10_000_000
    with pytest.raises(anthropic.BadRequestError) as a_err:
        anthropic.Anthropic(base_url=gw, api_key=KEY).messages.create(
            model="kimi", max_tokens=huge, messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert a_err.value.body["type"] == "error" and a_err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as o_err:
        openai.OpenAI(base_url=gw + "/v1", api_key=KEY).responses.create(
            model="kimi", input="hi", max_output_tokens=huge
        )
    assert o_err.value.body["message"] and "object" not in o_err.value.body
    r = httpx.post(
        gw + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}"},
        json={"model": "kimi", "max_tokens": huge, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and set(r.json()) == {"error"} and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["code"] == "context_length_exceeded"


def _hold(
    url: str, body: dict[str, Any], headers: dict[str, str], started: threading.Event, leave: threading.Event
) -> None:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        for _ in r.iter_raw():
            started.set()
            if leave.is_set():
                return


LONG = {
    "responses": {"model": "kimi", "input": "Write a long essay.", "stream": True},
    "messages": {
        "model": "kimi",
        "max_tokens": 8000,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long essay."}],
    },
}


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_team_limit_then_disconnect_frees_the_slot_and_the_upstream(stack: tuple[str, str], surface: str) -> None:
    gw, twin = stack
    url = f"{gw}/v1/{surface}"
    tight = {"authorization": f"Bearer {TIGHT_KEY}"}
    admin = {"authorization": f"Bearer {ADMIN}"}
    for _attempt in range(3):  # the holder's answer has a natural end: on a busy machine it may come first
        started, queued, leave = threading.Event(), threading.Event(), threading.Event()
        holder = threading.Thread(target=_hold, args=(url, LONG[surface], tight, started, leave))
        waiter = threading.Thread(target=_hold, args=(url, LONG[surface], tight, queued, leave))
        holder.start()
        try:
            assert started.wait(10)
            waiter.start()  # the one place in the tight team's queue
            deadline = time.monotonic() + 5
            while httpx.get(gw + "/admin/teams/tight", headers=admin).json()["waiting"] != 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            refused = httpx.post(url, json=LONG[surface], headers=tight)
            if not holder.is_alive() and refused.status_code == 200:
                continue  # the holder's stream ended before the third request came: not the case under test
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
            if surface == "messages":
                assert refused.json()["error"]["type"] == "rate_limit_error"
                assert refused.headers["x-cachegate-code"] == "team_queue_full"
            else:
                assert refused.json()["error"]["code"] == "team_queue_full"
            assert len(twin_of(twin).live) == 1
            break
        finally:
            leave.set()
            holder.join(10)
            waiter.join(10)  # dispatched when the holder left, then leaves at its first bytes
    else:
        pytest.fail("the holder's stream ended before the queue was full, three times")
    left = time.monotonic()
    while len(twin_of(twin).live) or httpx.get(gw + "/admin/teams/tight", headers=admin).json()["inflight"]:
        assert time.monotonic() - left < 1.0, "the slot or the upstream stream outlived the client"
        time.sleep(0.02)


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_spans_as_for_chat(stack: tuple[str, str], receiver: OtlpReceiver, surface: str) -> None:
    gw, _ = stack
    body = (
        {**LONG[surface], "input": "hi"}
        if surface == "responses"
        else {**LONG[surface], "messages": [{"role": "user", "content": "hi"}]}
    )
    with httpx.stream("POST", f"{gw}/v1/{surface}", json=body, headers={"x-api-key": KEY}, timeout=30) as r:
        rid = r.headers["x-request-id"]
        r.read()
    server, spans = receiver.trace_of(rid)
    assert server["kind"] == KIND_SERVER and server["name"] == f"{surface} kimi"
    assert server["attrs"]["gen_ai.operation.name"] == surface
    assert server["attrs"]["gen_ai.usage.output_tokens"] > 0 and server["attrs"]["http.response.status_code"] == 200
    names = {s["name"]: s for s in spans if s["parent"] == server["span_id"]}
    assert names["cachegate.admission"]["kind"] == names["cachegate.route"]["kind"] == KIND_INTERNAL
    assert any(s["kind"] == KIND_CLIENT for s in names.values())
    assert [e for e in server["events"] if e[0] == "first_token"]


@pytest.mark.parametrize("routes", ["all", "chat"])
def test_previous_response_id_on_another_replica_sharing_redis(redis_url: str, tmp_path: Path, routes: str) -> None:
    """Turn 1 on replica A, turn 2 (by ``previous_response_id``) and GET on replica B."""
    with run_twin("tiny", time_scale=0.05, model="kimi", stream_interval_s=0.005, routes=routes) as twin:
        cfg = write_config(tmp_path / "c.yaml", [twin], redis_url=redis_url)
        with run_gateway("--config", cfg) as a, run_gateway("--config", cfg) as b:
            first = openai.OpenAI(base_url=a + "/v1", api_key=KEY).responses.create(
                model="kimi", input="Look at the project.", tools=TOOLS
            )
            call = next(o for o in first.output if o.type == "function_call")
            other = openai.OpenAI(base_url=b + "/v1", api_key=KEY)
            with other.responses.stream(
                model="kimi",
                previous_response_id=first.id,
                tools=TOOLS,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "# demo"}],
            ) as stream:
                second = stream.get_final_response()
            assert second.output_text and second.usage is not None
            assert second.usage.input_tokens_details.cached_tokens > 0
            assert other.responses.retrieve(first.id).id == first.id
            with pytest.raises(openai.NotFoundError):  # another team's response reads as absent
                openai.OpenAI(base_url=b + "/v1", api_key=TIGHT_KEY).responses.retrieve(first.id)


@pytest.mark.parametrize("surface", ["responses", "messages"])
def test_a_long_wait_opens_the_stream_then_a_refusal_is_one_event(tmp_path: Path, surface: str) -> None:
    """Past ``queue_open_after_s`` a waiting stream gets 200 and keep-alives (``ping`` on Messages);
    its queue timeout then arrives as one in-stream error event in the surface's shape."""
    with run_twin("tiny", time_scale=1.0, model="kimi", stream_interval_s=0.01, abort_delay_s=0.0) as twin:
        cfg = write_config(tmp_path / "c.yaml", [twin], queue_open_after_s=0.3, upstream={"sse_keepalive_s": 0.2})
        data = yaml.safe_load(Path(cfg).read_text())
        data["teams"]["tight"] = {"max_concurrency": 1, "max_queue": 2, "queue_timeout_s": 1.0}
        Path(cfg).write_text(yaml.safe_dump(data))
        tight = {"authorization": f"Bearer {TIGHT_KEY}"}
        with run_gateway("--config", cfg) as gw:
            started, leave = threading.Event(), threading.Event()
            holder = threading.Thread(target=_hold, args=(f"{gw}/v1/{surface}", LONG[surface], tight, started, leave))
            holder.start()
            try:
                assert started.wait(10)
                with httpx.stream("POST", f"{gw}/v1/{surface}", json=LONG[surface], headers=tight, timeout=10) as r:
                    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                    body = r.read()
            finally:
                leave.set()
                holder.join(10)
    events = [e for e in body.split(b"\n\n") if e]
    if surface == "messages":
        assert events[0] == b'event: ping\ndata: {"type":"ping"}'
        assert events[-1].startswith(b"event: error\n")
        assert b'"type":"overloaded_error"' in events[-1]
    else:
        assert events[0] == b": keepalive"
        name, data = events[-1].split(b"\n")
        error = orjson.loads(data[len(b"data: ") :])
        assert name == b"event: error" and error["type"] == "error" and error["code"] == "queue_timeout"


def test_cancel_a_running_response(stack: tuple[str, str], mode: str) -> None:
    """Translated: the stream ends with ``response.failed``, its upstream is closed, GET says
    ``cancelled``. Passthrough: the gateway stores the backend's Response at its end, so a running
    one is not found (404) and the stream goes on."""
    gw, twin = stack
    key = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", gw + "/v1/responses", json=LONG["responses"], headers=key, timeout=30) as r:
        lines = r.iter_lines()
        created = next(orjson.loads(line[6:]) for line in lines if line.startswith("data: "))
        rid = created["response"]["id"]
        cancel = httpx.post(f"{gw}/v1/responses/{rid}/cancel", headers=key)
        if mode == "passthrough":
            assert cancel.status_code == 404 and cancel.json()["error"]["code"] == "response_not_found"
            return
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
        asked = time.monotonic()
        rest = [orjson.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert rest[-1]["type"] == "response.failed" and time.monotonic() - asked < 1.0
    while len(twin_of(twin).live):
        assert time.monotonic() - asked < 1.0, "the upstream of a cancelled response kept running"
        time.sleep(0.02)
    assert httpx.get(f"{gw}/v1/responses/{rid}", headers=key).json()["status"] == "cancelled"
