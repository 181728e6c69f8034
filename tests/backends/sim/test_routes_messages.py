"""backends/sim/routes_messages.py in-process: ``POST /v1/messages`` whole and streamed (thinking, text
and tool-use blocks; usage with the cache), ``/v1/messages/count_tokens``, and every refusal in
Anthropic's envelope. With the Anthropic SDK: tests/backends/test_twin_surfaces.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backends.sim.chat_template import render_chat
from backends.sim.planner import plan_chat
from backends.sim.tokenizer import count_tokens
from tests.backends.sim.twin_asgi import sse_events, twin_app

READ = {"name": "Read", "input_schema": {"type": "object", "properties": {}}}
MESSAGES = [{"role": "user", "content": "What does this repository do? " * 6}]


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 12, "messages": MESSAGES, **extra}


async def test_a_whole_message_echoes_the_model_and_counts_the_cache_on_the_second_call() -> None:
    async with twin_app() as (_, _t, c):
        first = (await c.post("/v1/messages", json=_body())).json()
        assert first["type"] == "message" and first["model"] == "claude-x" and first["stop_reason"] == "max_tokens"
        assert [b["type"] for b in first["content"]] == ["text"] and len(first["content"][0]["text"]) == 48
        assert first["usage"] == {"input_tokens": first["usage"]["input_tokens"], "output_tokens": 12}
        second = (await c.post("/v1/messages?beta=true", json=_body())).json()
        usage = second["usage"]
        assert usage["cache_read_input_tokens"] > 0
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == first["usage"]["input_tokens"]


async def test_thinking_and_a_tool_use_in_a_whole_message() -> None:
    async with twin_app(answer_scale=0.05) as (_, _t, c):
        body = _body(max_tokens=4000, tools=[READ], thinking={"type": "enabled", "budget_tokens": 1024})
        msg = (await c.post("/v1/messages", json=body)).json()
        assert [b["type"] for b in msg["content"]] == ["thinking", "tool_use"] and msg["stop_reason"] == "tool_use"
        assert msg["content"][1] == {"type": "tool_use", "id": "functions.Read:0", "name": "Read", "input": {}}


async def test_a_stream_opens_blocks_in_order_and_its_deltas_add_up() -> None:
    async with twin_app(answer_scale=0.05) as (_, _t, c):
        body = _body(max_tokens=4000, stream=True, thinking={"type": "enabled", "budget_tokens": 1024})
        events = [(k, json.loads(d)) for k, d in sse_events((await c.post("/v1/messages", json=body)).text)]
        kinds = [k for k, _ in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        starts = [d["content_block"]["type"] for k, d in events if k == "content_block_start"]
        assert starts == ["thinking", "text"]
        stops = [d["index"] for k, d in events if k == "content_block_stop"]
        assert stops == [0, 1]
        text = "".join(d["delta"].get("text", "") for k, d in events if k == "content_block_delta")
        thinking = "".join(d["delta"].get("thinking", "") for k, d in events if k == "content_block_delta")
        delta = events[-2][1]
        assert delta["delta"]["stop_reason"] == "end_turn"
        assert delta["usage"]["output_tokens"] == count_tokens(thinking) + count_tokens(text)
        assert events[0][1]["message"]["model"] == "claude-x"


async def test_a_streamed_tool_use_sends_its_input_as_one_json_delta() -> None:
    async with twin_app() as (_, _t, c):
        body = _body(max_tokens=4000, stream=True, tools=[READ])
        events = [(k, json.loads(d)) for k, d in sse_events((await c.post("/v1/messages", json=body)).text)]
        start = next(d for k, d in events if k == "content_block_start")
        assert start["content_block"] == {"type": "tool_use", "id": "functions.Read:0", "name": "Read", "input": {}}
        deltas = [d["delta"] for k, d in events if k == "content_block_delta"]
        assert deltas == [{"type": "input_json_delta", "partial_json": "{}"}]
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_count_tokens_is_the_rendered_chat_prompt() -> None:
    async with twin_app() as (_, _t, c):
        r = await c.post("/v1/messages/count_tokens", json={"model": "k", "messages": MESSAGES, "tools": [READ]})
        tools = [
            {"type": "function", "function": {"name": "Read", "description": "", "parameters": READ["input_schema"]}}
        ]
        assert r.json() == {"input_tokens": count_tokens(render_chat(MESSAGES, tools))}
        whole = (await c.post("/v1/messages", json=_body(tools=[READ], max_tokens=4000))).json()
        assert (
            whole["usage"]["input_tokens"] + whole["usage"].get("cache_read_input_tokens", 0)
            == r.json()["input_tokens"]
        )


@pytest.mark.parametrize(
    ("raw", "content_type", "match"),
    [
        (b"{}", "text/plain", "Only 'application/json' is allowed"),
        (b"{nope", "application/json", "JSON decode error"),
        (b"[]", "application/json", "valid dictionary"),
        (b'{"model": "k", "max_tokens": 1}', "application/json", "messages: Field required"),
        (b'{"model": "k", "max_tokens": 1, "messages": [{"content": "x"}]}', "application/json", "role"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
async def test_refusals_use_anthropics_envelope(path: str, raw: bytes, content_type: str, match: str) -> None:
    async with twin_app() as (_, _t, c):
        r = await c.post(path, content=raw, headers={"content-type": content_type})
        body = r.json()
        assert r.status_code == 400 and body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error" and match in body["error"]["message"]


async def test_a_message_without_max_tokens_is_refused_but_can_be_counted() -> None:
    async with twin_app() as (_, _t, c):
        body = {"model": "k", "messages": MESSAGES}
        r = await c.post("/v1/messages", json=body)
        assert r.status_code == 400 and "max_tokens: Field required" in r.json()["error"]["message"]
        assert (await c.post("/v1/messages/count_tokens", json=body)).status_code == 200


async def test_the_twins_own_refusals_keep_their_message_in_anthropics_envelope() -> None:
    async with twin_app() as (_, t, c):
        big = await c.post("/v1/messages", json=_body(max_tokens=300_000))
        assert big.status_code == 400 and "maximum context length" in big.json()["error"]["message"]
        pinned = await c.post("/v1/messages", json=_body(routed_dp_rank=3))
        assert pinned.status_code == 400 and "routed_dp_rank=3 is out of range" in pinned.json()["error"]["message"]
        chat = {"messages": MESSAGES, "max_tokens": 3000, "ignore_eos": True}
        t.submit("taken", plan_chat(t, chat, 3000, thinking=False), stream=True)  # a request with this id runs
        dup = await c.post("/v1/messages", json=_body(rid="taken"))
        assert dup.status_code == 400
        assert dup.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "Duplicate request ID: taken"},
        }
        t.abort("taken")
