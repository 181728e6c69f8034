"""The twin against SGLang 0.5.23 itself: its pydantic protocol models, its route table, its metrics.

Needs ``pip install --no-deps sglang==0.5.23`` and ``msgspec`` (the Makefile's install step does it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim import sglang_ref
from backends.sim.server import create_app
from backends.sim.testing import run_twin

P = sglang_ref.load_protocol()
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Write a haiku " * 20}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.05, abort_delay_s=0.3, stream_interval_s=0.01) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as c:
        yield c


def roundtrip(model: Any, data: dict[str, Any], **dump: Any) -> None:
    """``data`` validates with SGLang's model, and SGLang would serialise it to the very same JSON."""
    obj = model.model_validate(data)
    assert json.loads(obj.model_dump_json(by_alias=True, **dump)) == data


def sse_events(resp: httpx.Response) -> list[str]:
    events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    return events[:-1]


def test_pinned_release_is_installed() -> None:
    assert sglang_ref.installed_version() == sglang_ref.PINNED_VERSION


def test_chat_non_stream_is_sglang_json(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={"model": "kimi", "messages": MSGS, "max_tokens": 17})
    assert r.status_code == 200
    body = r.json()
    roundtrip(P.ChatCompletionResponse, body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 17
    assert len(choice["message"]["content"].encode()) == 4 * 17
    assert body["usage"]["prompt_tokens_details"] == {
        "cached_tokens": body["usage"]["prompt_tokens_details"]["cached_tokens"]
    }
    assert body["model"] == "kimi"


def test_chat_stream_chunks_and_usage_are_sglang_json(client: httpx.Client) -> None:
    req = {
        "model": "kimi",
        "messages": MSGS,
        "max_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(e) for e in sse_events(r)]
    for ev in events:
        P.ChatCompletionStreamResponse.model_validate(ev)
    assert events[0]["choices"][0]["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    usage_chunk = events[-1]
    assert usage_chunk["choices"] == []
    roundtrip(P.ChatCompletionStreamResponse, usage_chunk)
    finish = events[-2]["choices"][0]
    assert finish["finish_reason"] == "length"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert usage_chunk["usage"]["completion_tokens"] == 40
    assert len(text.encode()) == 4 * 40
    assert len({e["id"] for e in events}) == 1


def test_chat_stream_without_usage_and_with_continuous_stats(client: httpx.Client) -> None:
    req = {"messages": MSGS, "max_tokens": 12, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        events = [json.loads(e) for e in sse_events(r)]
    assert all(e["choices"] for e in events)  # no usage chunk unless asked
    req["stream_options"] = {"continuous_usage_stats": True}
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        events = [json.loads(e) for e in sse_events(r)]
    content = [e for e in events if e["choices"][0]["delta"].get("content")]
    assert content and all(e["usage"]["prompt_tokens"] > 0 for e in content)
    counts = [e["usage"]["completion_tokens"] for e in content]
    assert counts == sorted(counts) and counts[-1] == 12
    for ev in events:
        P.ChatCompletionStreamResponse.model_validate(ev)


def test_reasoning_and_tool_calls(client: httpx.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
            },
        }
    ]
    msgs = [{"role": "user", "content": "What does main.py do?"}]
    req = {
        "messages": msgs,
        "tools": tools,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"thinking": True},
    }
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        events = [json.loads(e) for e in sse_events(r)]
    for ev in events:
        P.ChatCompletionStreamResponse.model_validate(ev)
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert any(d.get("reasoning_content") for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert len(calls) == 1 and calls[0]["id"] == "functions.read_file:0"
    assert json.loads(calls[0]["function"]["arguments"]) == {"path": "README.md"}
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    usage = events[-1]["usage"]
    assert usage["reasoning_tokens"] > 0 and usage["completion_tokens"] > usage["reasoning_tokens"]
    # Non-streaming: the same decision, as a message with tool_calls.
    r2 = client.post("/v1/chat/completions", json={"messages": msgs, "tools": tools})
    body = r2.json()
    roundtrip(P.ChatCompletionResponse, body)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"
    # After the tool result, plain content and a natural stop.
    call = body["choices"][0]["message"]["tool_calls"][0]
    follow = [
        *msgs,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "print('hi')"},
    ]
    r3 = client.post("/v1/chat/completions", json={"messages": follow, "tools": tools})
    assert r3.json()["choices"][0]["finish_reason"] == "stop"
    assert r3.json()["choices"][0]["matched_stop"] is not None


def test_completions_are_sglang_json(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={"model": "kimi", "prompt": "def main():", "max_tokens": 9})
    assert r.status_code == 200
    roundtrip(P.CompletionResponse, r.json())
    assert r.json()["usage"]["completion_tokens"] == 9
    req = {"prompt": "def main():", "max_tokens": 25, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=req) as s:
        events = [json.loads(e) for e in sse_events(s)]
    for ev in events[:-1]:
        roundtrip(P.CompletionStreamResponse, ev)
    roundtrip(P.CompletionStreamResponse, events[-1], exclude_none=True)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert len("".join(e["choices"][0]["text"] for e in events[:-1]).encode()) == 4 * 25
    assert events[-1]["usage"]["completion_tokens"] == 25


def _error(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 400
    body = r.json()
    roundtrip(P.ErrorResponse, body)
    assert body["object"] == "error" and body["code"] == 400 and body["param"] is None
    return body


def test_error_envelopes(client: httpx.Client) -> None:
    e = _error(client.post("/v1/chat/completions", content=b'{"messages": []}', headers={"content-type": "text/plain"}))
    assert "application/json" in e["message"]
    e = _error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 1_100_000}]}))
    assert "longer than the model's context length" in e["message"] and e["type"] == "BadRequestError"
    e = _error(client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 300_000}))
    assert "maximum context length" in e["message"]
    _error(client.post("/v1/chat/completions", json={"model": "kimi"}))
    _error(client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}))
    # A stream that fails validation is a JSON 400, not SSE.
    r = client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 300_000, "stream": True})
    assert r.headers["content-type"].startswith("application/json")
    _error(r)
    _error(client.post("/v1/chat/completions", json={"messages": MSGS, "routed_dp_rank": 3}))


def test_cache_report_switch() -> None:
    with run_twin("tiny", time_scale=0.05, cache_report=False) as u:
        r = httpx.post(f"{u}/v1/chat/completions", json={"messages": MSGS, "max_tokens": 5}, timeout=30)
        roundtrip(P.ChatCompletionResponse, r.json())
        assert r.json()["usage"]["prompt_tokens_details"] is None


def test_models(client: httpx.Client, url: str) -> None:
    r = client.get("/v1/models")
    roundtrip(P.ModelList, r.json())
    card = r.json()["data"][0]
    assert card["max_model_len"] == 262144 and card["owned_by"] == "sglang"
    assert client.get(f"/v1/models/{card['id']}").json()["id"] == card["id"]
    r = client.get("/v1/models/nope")
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "The model 'nope' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


ISSUE_ROUTES = [
    "/health",
    "/health_generate",
    "/get_model_info",
    "/get_server_info",
    "/server_info",
    "/v1/loads",
    "/metrics",
    "/flush_cache",
    "/abort_request",
    "/generate",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/",
    "/v1/responses",
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel",
    "/v1/messages",
    "/v1/messages/count_tokens",
]


def test_routes_exist_in_sglang_http_server() -> None:
    sglang = sglang_ref.routes()
    app = create_app("tiny", time_scale=0.05)
    served: set[tuple[str, str]] = set()
    for route in app.routes:
        path = route.path.replace("{model:path}", "{model:path}")  # same path syntax as FastAPI
        served.update((path, m) for m in (route.methods or set()) if m != "HEAD")
    for path, method in served:
        if path.startswith("/_twin/") or path == "/openapi.json":
            continue  # twin-only debug routes; FastAPI's own schema route
        assert (path, method) in sglang, f"{method} {path} is not a route of SGLang 0.5.23"
    served_paths = {p for p, _ in served}
    for path in ISSUE_ROUTES:
        assert path in served_paths, path
        assert any(p == path for p, _ in sglang), path
    assert not any(p == "/get_load" for p, _ in sglang) and "/get_load" not in served_paths


SCHED_BASE = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
TOK_BASE = {"model_name", "engine_type"}
REQUIRED = [
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:cache_hit_rate",
    "sglang:max_total_num_tokens",
    "sglang:num_used_tokens",
    "sglang:gen_throughput",
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_requests_total",
    "sglang:num_aborted_requests_total",
    "sglang:num_retracted_requests_total",
    "sglang:realtime_tokens_total",
    "sglang:time_to_first_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:e2e_request_latency_seconds",
]


def test_metrics_names_types_labels_buckets(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 8})
    client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 8})  # a cache hit
    decls = sglang_ref.metric_declarations()
    fams = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    seen: set[str] = set()
    for fam in fams.values():
        decl_name = fam.name + "_total" if fam.type == "counter" else fam.name
        decl = decls.get(decl_name)
        assert decl is not None, f"{decl_name} is not a metric of SGLang 0.5.23"
        seen.add(decl_name)
        assert fam.type == decl.kind.lower(), decl_name
        base = SCHED_BASE if decl.collector.startswith("Scheduler") else TOK_BASE
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                assert decl.buckets is not None
                labels = set(s.labels) - {"le"}
            else:
                labels = set(s.labels)
            assert labels == base | set(decl.extra_labels), (decl_name, labels)
        if decl.buckets:
            les = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")})
            assert les[:-1] == list(decl.buckets) and les[-1] == float("inf"), decl_name
    assert set(REQUIRED) <= seen
    # The values are live: two requests were counted and one hit the cache.
    req = {s.labels["is_streaming"]: s.value for s in fams["sglang:num_requests"].samples}
    assert req["false"] >= 2
    assert sum(s.value for s in fams["sglang:cached_tokens"].samples) > 0
    assert [s.value for s in fams["sglang:max_total_num_tokens"].samples] == [65536.0]


def test_dp_server_reports_per_rank_and_pins_ranks() -> None:
    with run_twin("b300-dp8-fp8", time_scale=0.05, abort_delay_s=0.2) as u, httpx.Client(base_url=u, timeout=30) as c:
        info = c.get("/server_info").json()
        assert info["dp_size"] == 8 and info["enable_dp_attention"] is True and len(info["internal_states"]) == 8
        req = {"messages": MSGS, "max_tokens": 100_000, "stream": True, "routed_dp_rank": 5, "rid": "pinned"}
        with c.stream("POST", "/v1/chat/completions", json=req) as r:
            next(r.iter_lines())
            loads = c.get("/v1/loads").json()["loads"]
            assert [ld["num_running_reqs"] for ld in loads] == [0, 0, 0, 0, 0, 1, 0, 0]
            assert c.get("/v1/loads", params={"dp_rank": 5}).json()["loads"][0]["num_running_reqs"] == 1
            fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
            c.post("/abort_request", json={"rid": "pinned"})
        running = fams["sglang:num_running_reqs"].samples
        assert {s.labels["dp_rank"] for s in running} == {str(i) for i in range(8)}
        assert all(set(s.labels) == SCHED_BASE | {"dp_rank"} for s in running)
        assert {s.labels["dp_rank"]: s.value for s in running}["5"] == 1.0
        assert _error(c.post("/v1/chat/completions", json={"messages": MSGS, "routed_dp_rank": 8}))
