"""backends/sim/server.py: ``create_app`` wiring one twin: its settings reaching the :class:`Twin`, the
route sets and engines it serves (and refuses), the engine factory, KV-events and disaggregation
options, and :class:`RecordRequests` (what it keeps of each request, and what it does not)."""

from __future__ import annotations

from typing import Any

import pytest

from backends.sim.engine import Engine
from backends.sim.metrics import TwinMetrics
from backends.sim.metrics_vllm import VllmMetrics
from backends.sim.profiles import get_profile
from backends.sim.responses_api import Store
from backends.sim.server import ENGINES, ROUTE_SETS, create_app
from backends.sim.testing import free_port
from tests.backends.sim.twin_asgi import USER, twin_app


def test_unknown_route_sets_engines_and_roles_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown route set 'bogus'; choose one of: all, responses, chat"):
        create_app("tiny", routes="bogus")
    with pytest.raises(ValueError, match="unknown engine 'trt'; choose one of: sglang, vllm"):
        create_app("tiny", engine="trt")
    with pytest.raises(ValueError, match="prefill or decode"):
        create_app("tiny", disaggregation_mode="both")
    with pytest.raises(ValueError, match="Unknown event publisher"):
        create_app("tiny", kv_events_config='{"publisher": "kafka"}')
    assert set(ROUTE_SETS) == {"all", "responses", "chat"} and ENGINES == ("sglang", "vllm")


def test_the_settings_reach_the_twin_and_its_engine() -> None:
    made: list[dict[str, Any]] = []

    def factory(profile: Any, **kw: Any) -> Engine:
        made.append({"profile": profile.name, **kw})
        return Engine(profile, **kw)

    prof = get_profile("tiny")
    app = create_app(
        prof,
        time_scale=0.5,
        model="m",
        kv_tokens=32768,
        cache_report=False,
        abort_delay_s=0.7,
        stream_interval_s=0.01,
        reasoning=True,
        answer_scale=2.0,
        startup_delay_s=1.5,
        engine_factory=factory,
    )
    t = app.state.twin
    assert made == [{"profile": "tiny", "kv_tokens": 32768, "unbounded": False}]
    assert t.engine.max_total_num_tokens == 32768 and t.profile is prof
    assert (t.model, t.time_scale, t.cache_report, t.abort_delay_s, t.stream_interval_s) == ("m", 0.5, False, 0.7, 0.01)
    assert (t.reasoning, t.answer_scale, t.startup_delay_s, t.dialect) == (True, 2.0, 1.5, "sglang")
    assert isinstance(t.metrics, TwinMetrics) and t.events is None
    assert isinstance(app.state.responses_store, Store)


def test_an_unbounded_twin_and_a_null_kv_events_publisher() -> None:
    t = create_app("tiny", unbounded=True, kv_events_config='{"publisher": "null"}').state.twin
    assert t.engine.max_total_num_tokens > 10**9 and t.events is None


def _paths(app: Any) -> set[str]:
    return {r.path for r in app.routes}


def test_route_sets_choose_the_client_surfaces_beyond_chat() -> None:
    everything, responses, chat = (_paths(create_app("tiny", routes=r)) for r in ("all", "responses", "chat"))
    surfaces = {"/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel"}
    messages = {"/v1/messages", "/v1/messages/count_tokens"}
    assert surfaces | messages <= everything
    assert surfaces <= responses and not messages & responses
    assert not (surfaces | messages) & chat and {"/v1/chat/completions", "/v1/completions", "/generate"} <= chat
    assert everything - chat == surfaces | messages


def test_the_vllm_engine_serves_vllms_table_and_metrics() -> None:
    app = create_app("tiny", engine="vllm")
    t = app.state.twin
    assert t.dialect == "vllm" and isinstance(t.metrics, VllmMetrics)
    paths = _paths(app)
    assert {"/version", "/load", "/metrics", "/v1/chat/completions", "/v1/messages"} <= paths
    assert not {"/", "/get_server_info", "/v1/loads", "/generate", "/v1/tokenize"} & paths


async def test_record_requests_keeps_method_path_query_chosen_headers_and_status() -> None:
    async with twin_app() as (_, t, c):
        headers = {
            "authorization": "Bearer secret",
            "x-api-key": "k2",
            "user-agent": "ua/1",
            "anthropic-version": "v",
            "x-private": "no",
            "originator": "codex",
        }
        await c.post("/v1/chat/completions?beta=true", json={"messages": USER, "max_tokens": 2}, headers=headers)
        await c.get("/v1/models/missing")
        await c.get("/_twin/requests")
        await c.get("/_twin/last_traceparent")
        entries = [e for e in t.requests if "method" in e]
        assert [(e["method"], e["path"], e["status"]) for e in entries] == [
            ("POST", "/v1/chat/completions", 200),
            ("GET", "/v1/models/missing", 404),
        ]
        first = entries[0]
        assert first["query"] == "beta=true" and first["auth"] == ["authorization", "x-api-key"]
        assert first["headers"] == {"user-agent": "ua/1", "anthropic-version": "v", "originator": "codex"}
        assert "secret" not in str(list(t.requests)) and "k2" not in str(list(t.requests))


async def test_a_prefill_role_wraps_the_app() -> None:
    async with twin_app(disaggregation_mode="prefill", disaggregation_bootstrap_port=free_port()) as (_, t, c):
        state = (await c.get("/_twin/disagg")).json()
        assert state["mode"] == "prefill"
        assert (await c.get("/get_model_info")).json()["disaggregation_mode"] == "prefill"
        assert [e["path"] for e in t.requests] == ["/get_model_info"]  # /_twin/ routes are not recorded
    plain = create_app("tiny")
    assert "/_twin/disagg" not in _paths(plain)
