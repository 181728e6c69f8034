"""backends/sim/routes_openai.py in-process (httpx.ASGITransport): ``/v1/models``, chat and completions,
whole and streamed, their usage options and their 400s. SGLang's exact JSON: test_twin_fidelity.py."""

from __future__ import annotations

import json

import pytest

from backends.sim import responses as R
from tests.backends.sim.twin_asgi import MODEL, USER, sse_data, twin_app


async def test_the_model_list_and_one_model_by_its_path_name() -> None:
    async with twin_app(model="org/some-model") as (_, t, c):
        listed = (await c.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["org/some-model"]
        card = (await c.get("/v1/models/org/some-model")).json()
        assert card == {**listed["data"][0], "created": int(t.startup_time)} and card["max_model_len"] == 262_144
        missing = await c.get("/v1/models/other")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_a_whole_chat_answer_is_cut_by_max_tokens_with_exact_usage() -> None:
    async with twin_app() as (_, _t, c):
        r = await c.post("/v1/chat/completions", json={"messages": USER, "max_completion_tokens": 9, "max_tokens": 50})
        body = r.json()
        assert r.status_code == 200 and body["model"] == MODEL
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
        assert len(choice["message"]["content"]) == 4 * 9  # max_completion_tokens wins over max_tokens
        assert body["usage"]["completion_tokens"] == 9 and body["usage"]["prompt_tokens"] > 0


async def test_a_natural_end_is_stop_with_kimis_eos_and_reasoning_when_thinking() -> None:
    async with twin_app(answer_scale=0.02) as (_, _t, c):  # answers of 4-30 tokens: they end on their own
        body = {"messages": USER, "chat_template_kwargs": {"thinking": True}}
        r = (await c.post("/v1/chat/completions", json=body)).json()
        choice = r["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["matched_stop"] == R.KIMI_EOS_TOKEN_ID
        assert choice["message"]["reasoning_content"]
        assert r["usage"]["reasoning_tokens"] == len(choice["message"]["reasoning_content"]) // 4


async def test_the_stream_adds_up_to_the_whole_answer_and_ends_with_usage_then_done() -> None:
    async with twin_app() as (_, _t, c):
        req = {"messages": USER, "max_tokens": 120, "seed": 7}
        whole = (await c.post("/v1/chat/completions", json=req)).json()
        streamed = {**req, "stream": True, "stream_options": {"include_usage": True}}
        r = await c.post("/v1/chat/completions", json=streamed)
        assert r.headers["content-type"].startswith("text/event-stream")
        data = sse_data(r.text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert chunks[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
        assert text == whole["choices"][0]["message"]["content"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 120
        assert len({ch["id"] for ch in chunks}) == 1


async def test_continuous_usage_stats_count_up_and_no_usage_chunk_without_include_usage() -> None:
    async with twin_app() as (_, _t, c):
        req = {"messages": USER, "max_tokens": 200, "stream": True, "stream_options": {"continuous_usage_stats": True}}
        chunks = [json.loads(d) for d in sse_data((await c.post("/v1/chat/completions", json=req)).text)[:-1]]
        counts = [ch["usage"]["completion_tokens"] for ch in chunks if ch.get("usage")]
        assert len(counts) >= 2 and counts == sorted(counts) and counts[-1] == 200
        assert all(ch["choices"] for ch in chunks)  # no usage-only chunk


async def test_a_streamed_tool_call_comes_in_one_chunk_before_the_finish() -> None:
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
    async with twin_app() as (_, _t, c):
        req = {"messages": USER, "tools": tools, "stream": True}
        chunks = [json.loads(d) for d in sse_data((await c.post("/v1/chat/completions", json=req)).text)[:-1]]
        calls = [ch for ch in chunks if ch["choices"][0]["delta"].get("tool_calls")]
        assert len(calls) == 1 and calls[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "read_file"
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and chunks.index(calls[0]) == len(chunks) - 2
        assert not any(ch["choices"][0]["delta"].get("content") for ch in chunks)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"model": "kimi"}, "messages\n  Field required"),
        ({"messages": []}, "Field required"),
        ({"messages": [{"content": "no role"}]}, "Each message needs a role"),
        ({"messages": USER, "stream": True, "stream_options": "yes"}, "stream_options must be an object"),
        ({"messages": USER, "max_tokens": -1}, "non-negative integer"),
    ],
)
async def test_a_chat_request_sglang_refuses_is_a_json_400(body: dict[str, object], match: str) -> None:
    async with twin_app() as (_, t, c):
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.headers["content-type"] == "application/json"
        assert r.json()["object"] == "error" and match in r.json()["message"]
        assert not t.live


async def test_completions_whole_and_streamed() -> None:
    async with twin_app(cache_report=False) as (_, _t, c):
        whole = (await c.post("/v1/completions", json={"prompt": ["def f():"], "max_tokens": 6})).json()
        assert whole["object"] == "text_completion" and len(whole["choices"][0]["text"]) == 24
        assert whole["usage"]["completion_tokens"] == 6 and whole["usage"]["prompt_tokens_details"] is None
        req = {"prompt": "def f():", "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
        data = sse_data((await c.post("/v1/completions", json=req)).text)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"]) == whole["choices"][0]["text"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 2,
            "total_tokens": 8,
            "completion_tokens": 6,
            "reasoning_tokens": 0,
        }


@pytest.mark.parametrize("prompt", [["one", "two"], [1, 2, 3], None])
async def test_completions_take_one_string_prompt_only(prompt: object) -> None:
    async with twin_app() as (_, _t, c):
        r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400 and "one string prompt" in r.json()["message"]
