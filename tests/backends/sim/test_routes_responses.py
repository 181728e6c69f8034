"""backends/sim/routes_responses.py in-process: ``POST /v1/responses`` whole and streamed (message,
reasoning and function-call items, their events in order), the store (``store: false``,
``previous_response_id``, GET and cancel) and the 400/404s. With the official SDK and SGLang's
models: tests/backends/test_twin_surfaces.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.backends.sim.twin_asgi import sse_events, twin_app

READ = {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}}


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(kind, json.loads(data)) for kind, data in sse_events(text)]


async def test_a_whole_answer_is_one_message_stored_and_retrievable() -> None:
    async with twin_app() as (_, _t, c):
        r = (await c.post("/v1/responses", json={"input": "hello", "max_output_tokens": 12, "store": True})).json()
        assert r["id"].startswith("resp_") and r["status"] == "incomplete"
        assert r["incomplete_details"] == {"reason": "max_output_tokens"}
        assert [i["type"] for i in r["output"]] == ["message"] and len(r["output"][0]["content"][0]["text"]) == 48
        assert r["usage"]["output_tokens"] == 12 and r["usage"]["input_tokens"] > 0
        assert (await c.get(f"/v1/responses/{r['id']}")).json() == r
        assert (await c.post(f"/v1/responses/{r['id']}/cancel")).json() == r  # finished: returned unchanged


async def test_a_response_not_stored_cannot_be_retrieved_or_continued() -> None:
    async with twin_app() as (_, _t, c):
        r = (await c.post("/v1/responses", json={"input": "hello", "max_output_tokens": 4, "store": False})).json()
        got = await c.get(f"/v1/responses/{r['id']}")
        assert got.status_code == 404 and got.json()["type"] == "invalid_request_error"
        follow = await c.post("/v1/responses", json={"input": "more", "previous_response_id": r["id"]})
        assert follow.status_code == 404 and follow.json()["param"] == "response_id"


async def test_previous_response_id_continues_the_conversation_with_its_prefix_cached() -> None:
    async with twin_app() as (_, _t, c):
        first = (await c.post("/v1/responses", json={"input": "what is here?", "tools": [READ]})).json()
        call = first["output"][0]
        assert first["status"] == "completed" and call["type"] == "function_call" and call["name"] == "read_file"
        assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
        out = {"type": "function_call_output", "call_id": call["call_id"], "output": "README.md"}
        body = {"input": [out], "previous_response_id": first["id"], "tools": [READ], "max_output_tokens": 10}
        second = (await c.post("/v1/responses", json=body)).json()
        assert [i["type"] for i in second["output"]] == ["message"]
        assert second["previous_response_id"] == first["id"]
        assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
        assert second["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"] - 16


async def test_reasoning_effort_adds_a_reasoning_item_first() -> None:
    async with twin_app(answer_scale=0.05) as (_, _t, c):
        body = {"input": "think", "reasoning": {"effort": "low"}, "include": ["reasoning.encrypted_content"]}
        r = (await c.post("/v1/responses", json=body)).json()
        assert [i["type"] for i in r["output"]] == ["reasoning", "message"] and r["status"] == "completed"
        assert r["output"][0]["encrypted_content"] and r["output"][0]["summary"] == []
        assert r["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


async def test_a_stream_opens_and_closes_each_item_in_order_and_ends_with_the_final_response() -> None:
    async with twin_app(answer_scale=0.05) as (_, _t, c):
        body = {"input": "think", "stream": True, "reasoning": {"effort": "high", "summary": "auto"}}
        r = await c.post("/v1/responses", json=body)
        assert r.headers["cache-control"] == "no-cache"
        events = _events(r.text)
        kinds = [k for k, _ in events]
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        added = [d["item"]["type"] for k, d in events if k == "response.output_item.added"]
        done = [d["item"] for k, d in events if k == "response.output_item.done"]
        assert added == [i["type"] for i in done] == ["reasoning", "message"]
        summary = "".join(d["delta"] for k, d in events if k == "response.reasoning_summary_text.delta")
        text = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
        assert done[0]["summary"][0]["text"] == summary and done[1]["content"][0]["text"] == text
        assert kinds.index("response.reasoning_summary_part.done") < kinds.index("response.content_part.added")
        final = events[-1][1]["response"]
        assert final["output"] == done and final["status"] == "completed"
        assert (await c.get(f"/v1/responses/{final['id']}")).json() == final


async def test_a_streamed_function_call_and_a_streamed_cut() -> None:
    async with twin_app() as (_, _t, c):
        events = _events((await c.post("/v1/responses", json={"input": "look", "tools": [READ], "stream": True})).text)
        kinds = [k for k, _ in events]
        assert kinds[2:] == [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
        args = next(d for k, d in events if k == "response.function_call_arguments.done")
        assert args["name"] == "read_file" and json.loads(args["arguments"]) == {}
        cut = _events((await c.post("/v1/responses", json={"input": "x", "stream": True, "max_output_tokens": 5})).text)
        assert cut[-1][0] == "response.incomplete"


@pytest.mark.parametrize(
    ("body", "status", "match"),
    [
        ({"input": 3}, 400, "valid string or list"),
        ({"input": [{"role": "tool", "content": "x"}]}, 400, "unsupported role"),
        ({"input": "x", "previous_response_id": "nope"}, 400, "begins with 'resp'"),
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "not found"),
        ({"input": "x", "max_output_tokens": 300_000}, 400, "maximum context length"),
        ({"input": ["plain string item"]}, 400, "each item must be an object"),
    ],
)
async def test_what_sglang_refuses(body: dict[str, Any], status: int, match: str) -> None:
    async with twin_app() as (_, t, c):
        r = await c.post("/v1/responses", json=body)
        assert r.status_code == status and r.json()["object"] == "error" and match in r.json()["message"]
        assert not t.live


async def test_retrieve_refuses_an_id_that_is_no_response_id() -> None:
    async with twin_app() as (_, _t, c):
        r = await c.get("/v1/responses/msg_1")
        assert r.status_code == 400 and r.json()["param"] == "response_id"
