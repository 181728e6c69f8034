"""backends/sim/routes_native.py in-process: health, server and model info, ``/v1/loads`` (sections,
ranks, Prometheus text), ``/metrics``, cache flush, abort, ``/generate``, ``/``, ``/openapi.json`` and
the twin-only debug routes. Over real HTTP with a busy engine: tests/backends/test_twin_api.py."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from backends.sim import responses as R
from backends.sim.routes_native import _ids
from tests.backends.sim.twin_asgi import USER, sse_data, twin_app


async def test_health_is_503_until_the_startup_delay_has_passed() -> None:
    async with twin_app(startup_delay_s=0.05) as (_, _t, c):
        assert (await c.get("/health")).status_code == 503
        assert (await c.get("/health_generate")).status_code == 503
        await asyncio.sleep(0.1)
        assert (await c.get("/health")).status_code == 200


async def test_server_info_describes_a_dp_deployment_rank_by_rank() -> None:
    async with twin_app("b300-dp8-fp8", model="kimi-dp") as (_, t, c):
        info = (await c.get("/get_server_info")).json()
        assert (info["dp_size"], info["tp_size"], info["enable_dp_attention"]) == (8, 8, True)
        assert info["served_model_name"] == "kimi-dp" and info["version"] == "0.5.23"
        assert info["max_total_num_tokens"] == t.engine.max_total_num_tokens
        assert info["max_req_input_len"] == min(262_144, t.engine.max_total_num_tokens) - 1
        assert [s["dp_rank"] for s in info["internal_states"]] == list(range(8))
        assert info["twin"] == {"profile": "b300-dp8-fp8", "time_scale": 0.02}
        model = (await c.get("/model_info")).json()
        assert model["model_path"] == "kimi-dp" and model["disaggregation_mode"] == "null"


async def test_loads_sections_and_one_rank() -> None:
    async with twin_app("b300-dp8-fp8") as (_, _t, c):
        full = (await c.get("/v1/loads")).json()
        assert len(full["loads"]) == 8 and {"memory", "queues"} <= set(full["loads"][0])
        assert full["num_accelerators"] == 1  # tp 8 over 8 DP ranks
        core = (await c.get("/v1/loads", params={"include": "core"})).json()["loads"][0]
        assert "memory" not in core and "queues" not in core and "num_used_tokens" in core
        queues = (await c.get("/v1/loads", params={"include": "core,queues"})).json()["loads"][0]
        assert "queues" in queues and "memory" not in queues
        one = (await c.get("/v1/loads", params={"dp_rank": 3})).json()["loads"]
        assert [ld["dp_rank"] for ld in one] == [3]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"include": "core,bogus"}, "Invalid include sections"),
        ({"dp_rank": "8"}, "dp_rank 8 out of range [0, 8)"),
        ({"dp_rank": "x"}, "valid integer"),
    ],
)
async def test_loads_refuses_unknown_sections_and_ranks(params: dict[str, str], match: str) -> None:
    async with twin_app("b300-dp8-fp8") as (_, _t, c):
        r = await c.get("/v1/loads", params=params)
        assert r.status_code == 400 and match in r.json()["message"]


async def test_loads_in_prometheus_text_one_gauge_per_field_and_rank() -> None:
    async with twin_app("b300-dp2-bf16") as (_, t, c):
        r = await c.get("/v1/loads", params={"format": "prometheus"})
        assert r.headers["content-type"].startswith("text/plain")
        lines = r.text.splitlines()
        assert lines.count("# TYPE sglang_num_running_reqs gauge") == 1
        per_rank = t.engine.loads()[0].max_total_num_tokens
        assert f'sglang_max_total_num_tokens{{dp_rank="1"}} {per_rank}' in lines
        assert 'sglang_memory_graph_gb{dp_rank="0"} 0.0' in lines  # a section's fields are prefixed with it
        assert "decode_moments" not in r.text  # a null field is no sample


async def test_metrics_serve_the_twins_registry_without_created_series() -> None:
    async with twin_app() as (_, _t, c):
        await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 3})
        text = (await c.get("/metrics")).text
        assert "sglang:num_requests_total" in text and "_created" not in text
        assert 'sglang:generation_tokens_total{engine_type="unified",is_streaming="false"' in text


async def test_flush_cache_empties_an_idle_engines_cache() -> None:
    async with twin_app() as (_, _t, c):
        req = {"messages": USER, "max_tokens": 3}
        await c.post("/v1/chat/completions", json=req)
        cached = (await c.post("/v1/chat/completions", json=req)).json()["usage"]["prompt_tokens_details"]
        assert cached["cached_tokens"] > 0
        r = await c.post("/flush_cache")
        assert r.status_code == 200 and r.text.startswith("Cache flushed.")
        again = (await c.post("/v1/chat/completions", json=req)).json()["usage"]["prompt_tokens_details"]
        assert again["cached_tokens"] == 0


async def test_abort_request_by_id_and_all_and_its_malformed_bodies() -> None:
    async with twin_app() as (_, t, c):
        long = {"max_tokens": 20000, "ignore_eos": True, "stream": True}
        tasks = [
            asyncio.create_task(c.post("/v1/chat/completions", json={"messages": USER, "rid": rid, **long}))
            for rid in ("a1", "a2", "a3")
        ]
        while len(t.live) < 3:
            await asyncio.sleep(0.01)
        assert (await c.post("/abort_request", json={"rid": "a1"})).status_code == 200
        assert set(t.live) == {"a2", "a3"}
        assert (await c.post("/abort_request", json={"abort_all": True})).status_code == 200
        assert not t.live
        done = await asyncio.gather(*tasks)
        assert all(json.loads(sse_data(r.text)[-2])["choices"][0]["finish_reason"] == "abort" for r in done)
        bad = await c.post("/abort_request", content=b"{nope")
        assert bad.status_code == 400 and bad.json()["type"] == "Bad Request"
        assert (await c.post("/abort_request", json=[1])).status_code == 400
        assert (await c.post("/abort_request")).status_code == 200  # an empty body aborts nothing


async def test_generate_takes_token_ids_and_reports_a_natural_stop() -> None:
    async with twin_app(answer_scale=0.02) as (_, _t, c):
        r = (await c.post("/generate", json={"input_ids": list(range(12)), "rid": "g1"})).json()
        meta = r["meta_info"]
        assert meta["id"] == "g1" and meta["prompt_tokens"] == 12
        assert meta["finish_reason"] == {"type": "stop", "matched": R.KIMI_EOS_TOKEN_ID}
        assert len(r["output_ids"]) == meta["completion_tokens"] == len(r["text"]) // 4


async def test_a_streamed_generate_sends_cumulative_text_and_ends_with_its_finish() -> None:
    async with twin_app() as (_, _t, c):
        body = {"text": "Once upon a time", "stream": True, "sampling_params": {"max_new_tokens": 40}}
        data = sse_data((await c.put("/generate", json=body)).text)
        assert data[-1] == "[DONE]"
        events = [json.loads(d) for d in data[:-1]]
        texts = [e["text"] for e in events]
        assert all(b.startswith(a) for a, b in itertools.pairwise(texts)) and len(texts[-1]) == 160
        assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * (len(events) - 1)
        assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 40}


@pytest.mark.parametrize(
    ("raw", "match"),
    [(b"{nope", "JSON decode error"), (b"[1]", "valid dictionary"), (b'{"sampling_params": {}}', "text or input_ids")],
)
async def test_generate_refuses_a_body_without_a_prompt(raw: bytes, match: str) -> None:
    async with twin_app() as (_, _t, c):
        r = await c.post("/generate", content=raw)
        assert r.status_code == 400 and match in r.json()["error"]["message"]


def test_ids_stand_in_for_each_four_byte_token() -> None:
    ids = _ids("abcdefgh!", 3)
    assert len(ids) == 3 and all(0 <= i < 163840 for i in ids)
    assert ids == _ids("abcdefgh!", 3) and ids[:2] == _ids("abcdefgh", 2)
    assert ids[2] == int.from_bytes(b"!   ", "little") % 163840  # the last token padded with spaces


async def test_root_openapi_and_the_debug_routes() -> None:
    async with twin_app() as (_, _t, c):
        assert (await c.get("/")).json() == "SGLang is running" and (await c.head("/")).status_code == 200
        paths = (await c.get("/openapi.json")).json()["paths"]
        assert "head" in paths["/"] and "head" not in paths["/health"]
        assert "/v1/models/{model}" in paths and not any(p.startswith("/_twin") for p in paths)
        assert set(paths["/generate"]) == {"post", "put"}
        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        body = {"text": "hi", "rid": "t1", "sampling_params": {"max_new_tokens": 2}}
        await c.post("/generate", json=body, headers={"traceparent": tp})
        assert (await c.get("/_twin/last_traceparent")).json()["traceparent"] == tp
        other = (await c.get("/_twin/last_traceparent", params={"rid": "nobody"})).json()
        assert other == {"rid": "nobody", "traceparent": None, "tracestate": None}
        seen = (await c.get("/_twin/requests")).json()
        assert [s["path"] for s in seen if "method" in s] == ["/", "/", "/openapi.json", "/generate"]
