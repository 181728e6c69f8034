"""The live twin's behaviour over real HTTP: cache hits across turns, disconnect and abort, the
native and info routes, the official openai SDK, and the ``cachegate sim-backend`` process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.chat_template import render_chat
from backends.sim.testing import run_twin, spawn_twin, twin_of

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 40}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.05, abort_delay_s=0.3, stream_interval_s=0.01) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as c:
        yield c


def running(c: httpx.Client) -> int:
    return int(sum(ld["num_running_reqs"] + ld["num_waiting_reqs"] for ld in c.get("/v1/loads").json()["loads"]))


def metric(c: httpx.Client, family: str) -> float:
    fams = {f.name: f for f in text_string_to_metric_families(c.get("/metrics").text)}
    return sum(s.value for s in fams[family].samples if not s.name.endswith("_created"))


def test_template_next_turn_starts_with_prompt_plus_answer() -> None:
    msgs: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    tools = [{"type": "function", "function": {"name": "run", "parameters": {}}}]
    p1 = render_chat(msgs, tools)
    call = {"id": "functions.run:0", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    from backends.sim.chat_template import assistant_text

    msgs2 = [
        *msgs,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "functions.run:0", "content": "ok"},
    ]
    assert render_chat(msgs2, tools).startswith(p1 + assistant_text("", [call]))
    msgs3 = [*msgs, {"role": "assistant", "content": "done."}, {"role": "user", "content": "thanks"}]
    assert render_chat(msgs3, tools).startswith(p1 + "done.")


def test_second_turn_hits_cache_for_prompt_and_answer(client: httpx.Client) -> None:
    msgs: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Refactor module A " * 30}]
    r1 = client.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 50}).json()
    u1 = r1["usage"]
    msgs += [
        {"role": "assistant", "content": r1["choices"][0]["message"]["content"]},
        {"role": "user", "content": "and now module B " * 20},
    ]
    req = {"messages": msgs, "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    u2 = json.loads(lines[-2])["usage"]
    seen = u1["prompt_tokens"] + u1["completion_tokens"]
    page = 16
    assert seen - page <= u2["prompt_tokens_details"]["cached_tokens"] <= seen
    assert u2["prompt_tokens"] > seen


def test_disconnect_aborts_after_delay_and_keeps_prefix() -> None:
    with (
        run_twin("tiny", time_scale=0.2, abort_delay_s=0.5, stream_interval_s=0.01) as u,
        httpx.Client(base_url=u, timeout=30) as c,
    ):
        msgs = [SYSTEM, {"role": "user", "content": "long answer please " * 20}]
        req = {"messages": msgs, "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/chat/completions", json=req) as r:
            it = r.iter_lines()
            got = [next(it) for _ in range(4)]
            assert any('"content"' in g for g in got)
        gone = time.monotonic()
        assert running(c) == 1
        while running(c) and time.monotonic() - gone < 5:
            time.sleep(0.02)
        waited = time.monotonic() - gone
        assert running(c) == 0
        assert 0.4 <= waited < 2.0, waited
        assert metric(c, "sglang:num_aborted_requests") == 1
        usage = c.get("/v1/loads").json()["loads"][0]
        assert usage["num_running_reqs"] == 0
        # The prompt's prefix stayed cached: the same prompt hits it.
        again = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4}).json()["usage"]
        assert again["prompt_tokens_details"]["cached_tokens"] >= again["prompt_tokens"] - 16


def test_abort_request_route_ends_a_stream(client: httpx.Client) -> None:
    rid = "abort-me-1"
    req = {
        "rid": rid,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 20000,
        "ignore_eos": True,
        "stream": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        it = r.iter_lines()
        next(it)
        assert client.post("/abort_request", json={"rid": rid}).status_code == 200
        rest = [ln for ln in it if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "abort"
    assert running(client) == 0


def test_flush_cache_is_refused_while_busy(client: httpx.Client) -> None:
    req = {
        "messages": [{"role": "user", "content": "busy"}],
        "max_tokens": 20000,
        "ignore_eos": True,
        "stream": True,
        "rid": "busy-1",
    }
    with client.stream("POST", "/v1/chat/completions", json=req) as r:
        next(r.iter_lines())
        busy = client.post("/flush_cache")
        client.post("/abort_request", json={"abort_all": True})
    assert busy.status_code == 400
    deadline = time.monotonic() + 3  # the abort lands at the engine's next pass boundary
    while (ok := client.get("/flush_cache")).status_code == 400 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ok.status_code == 200 and ok.text.startswith("Cache flushed.")


def test_non_streaming_client_that_leaves_is_aborted() -> None:
    with run_twin("tiny", time_scale=0.2, abort_delay_s=0.25) as u, httpx.Client(base_url=u, timeout=30) as c:

        def fire() -> None:
            with pytest.raises(httpx.TimeoutException):
                httpx.post(
                    f"{u}/v1/chat/completions",
                    timeout=0.3,
                    json={"messages": [{"role": "user", "content": "slow"}], "max_tokens": 20000, "ignore_eos": True},
                )

        t = threading.Thread(target=fire)
        t.start()
        t.join()
        deadline = time.monotonic() + 5
        while running(c) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert running(c) == 0
        assert metric(c, "sglang:num_aborted_requests") == 1


def test_generate_native(client: httpx.Client) -> None:
    r = client.post("/generate", json={"text": "Once upon a time", "sampling_params": {"max_new_tokens": 6}})
    body = r.json()
    assert r.status_code == 200 and len(body["output_ids"]) == 6 and len(body["text"]) == 24
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 4 and meta["completion_tokens"] == 6 and meta["e2e_latency"] > 0
    assert meta["cached_tokens"] == 0
    with client.stream(
        "POST",
        "/generate",
        json={"text": "Once upon a time", "stream": True, "sampling_params": {"max_new_tokens": 30}},
    ) as s:
        events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["meta_info"]["completion_tokens"] == 30 and len(last["text"]) == 120  # cumulative text
    assert 0 < last["meta_info"]["cached_tokens"] <= 4  # the same prompt again
    r = client.post("/generate", json={"text": "x" * 1_100_000})
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_info_routes(client: httpx.Client) -> None:
    info = client.get("/server_info").json()
    for key in (
        "max_total_num_tokens",
        "max_running_requests",
        "page_size",
        "chunked_prefill_size",
        "tp_size",
        "dp_size",
        "context_length",
        "schedule_policy",
        "internal_states",
        "version",
    ):
        assert key in info
    assert info["version"] == "0.5.23" and info["page_size"] == 16 and info["max_total_num_tokens"] == 65536
    assert len(info["internal_states"]) == info["dp_size"] == 1
    assert client.get("/get_server_info").json()["context_length"] == 262144
    assert client.get("/get_model_info").json()["is_generation"] is True
    loads = client.get("/v1/loads").json()
    assert loads["version"] == "0.5.23" and loads["loads"][0]["max_total_num_tokens"] == 65536
    assert set(client.get("/v1/loads?include=core").json()["loads"][0]) >= {"num_running_reqs", "token_usage"}
    assert "memory" not in client.get("/v1/loads?include=core").json()["loads"][0]
    assert client.get("/v1/loads?include=bogus").status_code == 400
    prom = client.get("/v1/loads?format=prometheus").text
    assert "# TYPE sglang_num_running_reqs gauge" in prom and 'sglang_max_total_num_tokens{dp_rank="0"} 65536' in prom
    assert client.get("/health").status_code == 200 and client.get("/health_generate").text == ""
    assert client.get("/get_load").status_code == 404


def test_health_is_503_while_starting() -> None:
    with run_twin("tiny", time_scale=0.05, startup_delay_s=0.5, wait=False) as u:
        assert httpx.get(f"{u}/health").status_code == 503
        assert httpx.get(f"{u}/health_generate").status_code == 503
        time.sleep(0.6)
        assert httpx.get(f"{u}/health").status_code == 200


def test_traceparent_is_recorded(client: httpx.Client) -> None:
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    client.post(
        "/v1/chat/completions",
        headers={"traceparent": tp, "tracestate": "a=b"},
        json={"rid": "traced-1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert client.get("/_twin/last_traceparent").json()["traceparent"] == tp
    by_rid = client.get("/_twin/last_traceparent", params={"rid": "traced-1"}).json()
    assert by_rid == {"rid": "traced-1", "traceparent": tp, "tracestate": "a=b"}


def test_dp_rank_pinning(url: str, client: httpx.Client) -> None:
    ok = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "data_parallel_rank": 0},
    )
    assert ok.status_code == 200
    assert twin_of(url).engine.dp_size == 1


def test_openai_sdk(url: str) -> None:
    sdk = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    out = sdk.chat.completions.create(model="kimi", messages=[{"role": "user", "content": "hello"}], max_tokens=12)
    assert out.choices[0].finish_reason == "length" and out.usage is not None
    assert out.usage.completion_tokens == 12 and out.usage.prompt_tokens_details is not None
    stream = sdk.chat.completions.create(
        model="kimi",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 80 and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt as above
    comp = sdk.completions.create(model="kimi", prompt="abc", max_tokens=3)
    assert comp.usage is not None and comp.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="kimi", messages=[{"role": "user", "content": "x" * 1_100_000}])
    assert [m.id for m in sdk.models.list()] == ["moonshotai/Kimi-K2-Instruct"]


def test_sim_backend_process() -> None:
    with spawn_twin(
        "tiny",
        time_scale=0.05,
        extra_args=[
            "--model",
            "kimi-test",
            "--no-cache-report",
            "--kv-tokens",
            "32768",
            "--routes",
            "chat",
            "--scale",
            "0.01",
        ],
    ) as u:
        r = httpx.post(
            f"{u}/v1/chat/completions",
            timeout=30,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"] is None
        assert httpx.get(f"{u}/v1/models").json()["data"][0]["id"] == "kimi-test"
        assert httpx.get(f"{u}/server_info").json()["max_total_num_tokens"] == 32768
        assert httpx.post(f"{u}/v1/messages", json={}).status_code == 404  # --routes chat
        r = httpx.post(f"{u}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hey"}]}, timeout=30)
        assert r.json()["usage"]["completion_tokens"] <= 15  # --scale 0.01: 200-1,500 tokens become 2-15
