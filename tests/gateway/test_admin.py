"""gateway/admin.py: the admin API under ``/admin/`` (its token check, team limits read and changed at run
time, the state view) on the in-process app (tests/gateway/asgi.py), and its views' own arithmetic."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admin import TEAM_FIELDS, describe_limits, seat_budget
from gateway.worker import Gateway
from policies.admission import SeatParams
from policies.teams import TeamLimits
from policies.types import BackendView
from tests.fake_upstream import FakeUpstream
from tests.gateway.asgi import config, running
from tests.gateway.asgi import gateway_of as _gw

TOKEN = "adm-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TEAMS = {"default": {"max_concurrency": 4}, "platform": {"max_concurrency": 2, "max_queue": 3}}


async def test_the_admin_api_is_off_without_a_token(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url)) as (_, client):
        response = await client.get("/admin/state", headers=AUTH)
    assert response.status_code == 404 and response.json()["error"]["code"] == "admin_disabled"
    assert "CACHEGATE_ADMIN_TOKEN" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}, {"authorization": f"Basic {TOKEN}"}],
    ids=["none", "wrong", "no-scheme", "basic"],
)
async def test_every_admin_call_needs_the_bearer_token(upstream: FakeUpstream, headers: dict[str, str]) -> None:
    async with running(config(upstream.url), admin_token=TOKEN) as (_, client):
        for method, path in (("GET", "/admin/state"), ("GET", "/admin/teams/x"), ("PUT", "/admin/teams/x")):
            response = await client.request(method, path, headers=headers, json={"max_queue": 1})
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_admin_token"
        assert (await client.get("/admin/state", headers={"authorization": f"bearer  {TOKEN} "})).status_code == 200


async def test_a_team_reads_its_configured_limits_or_the_defaults(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, teams=TEAMS), admin_token=TOKEN) as (_, client):
        platform = (await client.get("/admin/teams/platform", headers=AUTH)).json()
        unknown = (await client.get("/admin/teams/nobody", headers=AUTH)).json()
    assert platform["team"] == "platform" and platform["inflight"] == 0 and platform["waiting"] == 0
    assert platform["limits"]["max_concurrency"] == 2 and platform["limits"]["max_queue"] == 3
    assert set(platform["limits"]) == TEAM_FIELDS and platform["waiting_for_lease"] == 0
    assert unknown["limits"]["max_concurrency"] == 4, "a team not configured gets the default's limits"


async def test_a_put_merges_into_the_limits_in_force_and_reaches_the_core(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, teams=TEAMS), admin_token=TOKEN) as (app, client):
        first = await client.put("/admin/teams/platform", headers=AUTH, json={"max_concurrency": 5})
        second = await client.put("/admin/teams/platform", headers=AUTH, json={"weight": 2.5})
        read = (await client.get("/admin/teams/platform", headers=AUTH)).json()
        core = _gw(app).core
    assert first.status_code == 200 and first.json()["limits"]["max_concurrency"] == 5
    limits = second.json()["limits"]
    assert (limits["max_concurrency"], limits["max_queue"], limits["weight"]) == (5, 3, 2.5), "merged, not replaced"
    assert read["limits"] == limits
    assert core.limits["platform"].max_concurrency == 5 and core.limits["platform"].weight == 2.5


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b"{not json", "invalid_json", None),
        (b"[1, 2]", "invalid_request", None),
        (b'{"max_concurrency": 1, "colour": "red"}', "invalid_request", "colour"),
        (b'{"max_concurrency": -1}', "invalid_request", "max_concurrency"),
        (b'{"queue_timeout_s": 0}', "invalid_request", "queue_timeout_s"),
    ],
)
async def test_a_bad_put_is_a_400_and_changes_nothing(
    upstream: FakeUpstream, body: bytes, code: str, param: str | None
) -> None:
    async with running(config(upstream.url, teams=TEAMS), admin_token=TOKEN) as (app, client):
        response = await client.put("/admin/teams/platform", headers=AUTH, content=body)
        after = (await client.get("/admin/teams/platform", headers=AUTH)).json()
        assert _gw(app).core.limits["platform"].max_concurrency == 2
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == code and error["param"] == param
    assert after["limits"]["max_concurrency"] == 2 and after["limits"]["queue_timeout_s"] > 0


async def test_a_put_that_redis_cannot_store_is_a_503(upstream: FakeUpstream) -> None:
    cfg = config(upstream.url, teams=TEAMS, redis_url="redis://127.0.0.1:1/0")  # nothing listens there
    async with running(cfg, admin_token=TOKEN) as (_, client):
        response = await client.put("/admin/teams/platform", headers=AUTH, json={"max_concurrency": 9})
        after = (await client.get("/admin/teams/platform", headers=AUTH)).json()
    assert response.status_code == 503 and response.json()["error"]["code"] == "state_unavailable"
    assert after["limits"]["max_concurrency"] == 2


@pytest.mark.redis
async def test_a_put_is_stored_in_redis(upstream: FakeUpstream, redis_url: str) -> None:
    async with running(config(upstream.url, teams=TEAMS, redis_url=redis_url), admin_token=TOKEN) as (app, client):
        response = await client.put("/admin/teams/platform", headers=AUTH, json={"max_queue": 7})
        stored = await _gw(app).state.teams()
    assert response.status_code == 200 and stored["platform"]["max_queue"] == 7
    assert stored["platform"]["max_concurrency"] == 2


async def test_the_state_view_shows_backends_capacity_and_seat_budgets(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url), admin_token=TOKEN) as (_, client):
        state = (await client.get("/admin/state", headers=AUTH)).json()
    assert state["policy"] == "gateway" and state["state"]["mode"] == "memory" and state["waiting"] == 0
    assert state["kv_events"] is None and state["core"]["waiting_for_lease"] == 0
    backend = state["backends"][f"127.0.0.1:{upstream.port}"]
    assert backend["model"] == "kimi" and backend["healthy"] is True
    capacity = backend["capacity"]
    assert capacity["kv_tokens_per_rank"] == upstream.kv_tokens and capacity["learned"] is None
    assert capacity["seat_budget_tokens"] == int(SeatParams().admit_water * upstream.kv_tokens)


async def test_the_state_view_has_no_seat_budget_without_seats(upstream: FakeUpstream) -> None:
    async with running(config(upstream.url, policy="direct"), admin_token=TOKEN) as (_, client):
        state = (await client.get("/admin/state", headers=AUTH)).json()
    assert state["policy"] == "direct"
    assert state["backends"][f"127.0.0.1:{upstream.port}"]["capacity"]["seat_budget_tokens"] is None


async def test_a_request_waiting_for_its_lease_is_not_shown_in_flight(upstream: FakeUpstream) -> None:
    teams = {"default": {"max_concurrency": 4}}
    async with running(config(upstream.url, teams=teams), admin_token=TOKEN) as (app, client):
        gw = _gw(app)
        held = asyncio.create_task(client.post("/v1/chat/completions", json=_chat("stall")))
        try:
            for _ in range(200):
                await asyncio.sleep(0.01)
                if gw.core.teams.get("default") and gw.core.teams["default"].inflight == 1:
                    break
            before = (await client.get("/admin/teams/default", headers=AUTH)).json()
            gw.dispatcher.leasing["cg-pending"] = "default"  # as a dispatch whose Redis lease is on its way
            team = (await client.get("/admin/teams/default", headers=AUTH)).json()
            state = (await client.get("/admin/state", headers=AUTH)).json()
        finally:
            gw.dispatcher.leasing.clear()
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
    assert before["inflight"] == 1 and before["waiting_for_lease"] == 0
    assert team["inflight"] == 0 and team["waiting_for_lease"] == 1
    core = state["core"]
    assert core["teams"]["default"]["inflight"] == 0 and core["teams"]["default"]["waiting_for_lease"] == 1
    assert core["waiting_for_lease"] == 1 and core["running"] == 0


def _chat(content: str) -> dict[str, object]:
    return {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": content}]}


def test_the_seat_budget_counts_a_host_tier_only_when_it_can_reload() -> None:
    gw = Gateway(config("http://127.0.0.1:1", admission={"admit_water": 0.5, "host_water": 0.25}))
    try:
        assert seat_budget(gw, BackendView("b", kv_tokens=1000)) == 500
        assert seat_budget(gw, BackendView("b", kv_tokens=1000, host_tokens=4000)) == 500, "no reload speed"
        with_host = BackendView("b", kv_tokens=1000, host_tokens=4000, reload_tokens_per_s=1e6)
        assert seat_budget(gw, with_host) == int(0.5 * (1000 + 0.25 * 4000))
        assert seat_budget(gw, BackendView("b", kv_tokens=0)) is None, "unknown capacity"
    finally:
        gw.metrics.close()


def test_describe_limits_keeps_the_config_fields_only() -> None:
    described = describe_limits(TeamLimits(max_concurrency=3))
    assert set(described) == TEAM_FIELDS and described["max_concurrency"] == 3
