"""The client routes that are not generations (gateway/surfaces/client_routes.py), through the in-process app in
front of a simulated SGLang: the model list with each model's context window and the names a client may
ask for, one model by name, alias or pattern, a stored response read and cancelled only by its team,
``count_tokens`` in Anthropic's envelope, and Claude Code's reachability check."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from backends.sim.testing import run_twin
from gateway.config.schema import Config, hash_key
from gateway.surfaces.response_store import StoredResponse
from gateway.surfaces.translate import messages as ms
from tests.gateway.asgi import running

RED, BLUE = "sk-red", "sk-blue"
SERVED_BY_TWIN = "moonshotai/Kimi-K2-Instruct"
COUNT = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x" * 400}]}


@pytest.fixture(scope="module")
def twin() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.01) as url:
        yield url


@pytest.fixture()
async def app(twin: str) -> AsyncIterator[tuple[Any, Any]]:
    config = Config.model_validate(
        {
            "models": {"kimi": {"upstream_model": SERVED_BY_TWIN, "backends": [{"url": twin}]}},
            "aliases": {"claude-*": "kimi", "gpt-4o": "kimi", "org/kimi-latest": "kimi"},
            "keys": [{"sha256": hash_key(RED), "team": "red"}, {"sha256": hash_key(BLUE), "team": "blue"}],
            "teams": {"red": {"max_concurrency": 4}, "blue": {"max_concurrency": 4}},
            "health": {"interval_s": 30.0, "load_interval_s": 30.0},
            "policy": "direct",
        }
    )
    async with running(config) as (starlette, client):
        yield starlette.state.gateway, client


def _as(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_the_model_list(app: tuple[Any, Any]) -> None:
    gw, client = app
    response = await client.get("/v1/models", headers=_as(RED))
    assert response.status_code == 200
    listed = response.json()
    assert listed["object"] == "list"
    cards = {card["id"]: card for card in listed["data"]}
    assert set(cards) == {"kimi", "gpt-4o", "org/kimi-latest"}, "patterns are not names a client can be told"
    assert cards["kimi"] == {
        "id": "kimi",
        "object": "model",
        "created": gw.started_at,
        "owned_by": "cachegate",
        "max_model_len": 262144,
        "context_window": 262144,
    }
    assert cards["gpt-4o"]["alias_of"] == "kimi" and cards["gpt-4o"]["max_model_len"] == 262144


@pytest.mark.parametrize(
    ("name", "alias_of"), [("kimi", None), ("gpt-4o", "kimi"), ("claude-opus-4-1", "kimi"), ("org/kimi-latest", "kimi")]
)
async def test_one_model_by_name_alias_or_pattern(app: tuple[Any, Any], name: str, alias_of: str | None) -> None:
    _, client = app
    response = await client.get(f"/v1/models/{name}", headers=_as(BLUE))
    assert response.status_code == 200
    card = response.json()
    assert card["id"] == name and card.get("alias_of") == alias_of and card["max_model_len"] == 262144


async def test_an_unknown_model_and_a_missing_key(app: tuple[Any, Any]) -> None:
    _, client = app
    response = await client.get("/v1/models/llama", headers=_as(RED))
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found" and response.json()["error"]["param"] == "model"
    for path in ("/v1/models", "/v1/models/kimi"):
        refused = await client.get(path)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "missing_api_key"


async def _stored(gw: Any, rid: str, status: str, team: str = "red") -> None:
    response = {"id": rid, "object": "response", "status": status, "output": []}
    await gw.responses.store.put(StoredResponse(rid, team, "kimi", status, 1.0, [], response))


async def test_a_stored_response_is_read_by_its_team_only(app: tuple[Any, Any]) -> None:
    gw, client = app
    await _stored(gw, "resp_done", "completed")
    await gw.responses.store.cancel("resp_done", "red")  # not cancellable: stays completed
    got = await client.get("/v1/responses/resp_done", headers=_as(RED))
    assert got.status_code == 200 and got.json() == {
        "id": "resp_done",
        "object": "response",
        "status": "completed",
        "output": [],
    }
    for key, rid in ((BLUE, "resp_done"), (RED, "resp_none")):
        missing = await client.get(f"/v1/responses/{rid}", headers=_as(key))
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "response_not_found"


async def test_cancel_a_response(app: tuple[Any, Any]) -> None:
    gw, client = app
    await _stored(gw, "resp_run", "in_progress")
    await _stored(gw, "resp_done", "completed")
    assert (await client.post("/v1/responses/resp_run/cancel", headers=_as(BLUE))).status_code == 404
    cancelled = await client.post("/v1/responses/resp_run/cancel", headers=_as(RED))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    record = await gw.responses.store.get("resp_run", "red")
    assert record is not None and record.status == "cancelled"
    done = await client.post("/v1/responses/resp_done/cancel", headers=_as(RED))
    assert done.status_code == 400 and done.json()["error"]["code"] == "response_not_cancellable"
    assert "'completed'" in done.json()["error"]["message"]
    missing = await client.post("/v1/responses/resp_none/cancel", headers=_as(RED))
    assert missing.status_code == 404


@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/messages/count_tokens"])
async def test_count_tokens(app: tuple[Any, Any], path: str) -> None:
    gw, client = app
    response = await client.post(path, json=COUNT, headers={"x-api-key": RED})
    assert response.status_code == 200
    assert response.json() == ms.count_tokens(COUNT, gw.estimator.ratio)
    assert response.json()["input_tokens"] >= 100


@pytest.mark.parametrize(
    ("body", "headers", "status", "kind", "code"),
    [
        ({**COUNT, "model": "llama"}, {"x-api-key": RED}, 404, "not_found_error", "model_not_found"),
        ({"messages": COUNT["messages"]}, {"x-api-key": RED}, 404, "not_found_error", "model_not_found"),
        ({**COUNT, "messages": []}, {"x-api-key": RED}, 400, "invalid_request_error", "invalid_request"),
        (b"{nope", {"x-api-key": RED}, 400, "invalid_request_error", "invalid_json"),
        (COUNT, {}, 401, "authentication_error", "missing_api_key"),
        (COUNT, {"x-api-key": "sk-wrong"}, 401, "authentication_error", "invalid_api_key"),
    ],
)
async def test_count_tokens_errors_in_anthropics_envelope(
    app: tuple[Any, Any], body: Any, headers: dict[str, str], status: int, kind: str, code: str
) -> None:
    _, client = app
    if isinstance(body, bytes):
        response = await client.post("/v1/messages/count_tokens", content=body, headers=headers)
    else:
        response = await client.post("/v1/messages/count_tokens", json=body, headers=headers)
    assert response.status_code == status and response.headers["x-cachegate-code"] == code
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == kind


async def test_the_root_answers_a_reachability_check(app: tuple[Any, Any]) -> None:
    _, client = app
    head = await client.head("/")
    assert head.status_code == 200 and head.content == b""
    root = await client.get("/")
    assert root.status_code == 200 and root.json()["service"] == "cachegate"
    assert "/v1/messages" in root.json()["routes"] and "/v1/responses" in root.json()["routes"]
