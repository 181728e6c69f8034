"""The admin API under ``/admin/`` on the gateway's port: read and change team limits at run
time, see queues and in-flight work. Off unless an admin token is configured; every call needs
``Authorization: Bearer <token>`` (compared in constant time), else 401."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import check_token
from gateway.config import TeamConfig
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.app import Gateway

TEAM_FIELDS = set(TeamConfig.model_fields)


def _authorize(gw: Gateway, request: Request) -> None:
    if not gw.admin_token:
        raise GatewayError(404, "The admin API is off: start the gateway with --admin-token or "
                                f"${gw.config.admin_token_env}.", "admin_disabled")
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not check_token(token.strip(), gw.admin_token):
        raise GatewayError(401, "Missing or wrong admin token.", "invalid_admin_token")


def routes(gw: Gateway) -> list[Route]:
    async def get_team(request: Request) -> Response:
        _authorize(gw, request)
        name = request.path_params["team"]
        return JSONResponse(_holding_team(gw, gw.team_view(name)))

    async def put_team(request: Request) -> Response:
        _authorize(gw, request)
        name = request.path_params["team"]
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            raise GatewayError(400, "The body must be a JSON object of team limits.", "invalid_json") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "The body must be a JSON object of team limits.", "invalid_request")
        unknown = sorted(set(body) - TEAM_FIELDS)
        if unknown:
            raise GatewayError(400, f"Unknown team field(s): {', '.join(unknown)}; known: "
                                    f"{', '.join(sorted(TEAM_FIELDS))}.", "invalid_request", unknown[0])
        current = gw.team_limits(name)
        try:
            merged = TeamConfig.model_validate({**current, **body})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise GatewayError(400, f"Invalid team limits: {first['msg']}.", "invalid_request",
                               ".".join(str(p) for p in first["loc"])) from None
        try:
            await gw.state.set_team(name, merged.model_dump())
        except (RedisError, OSError) as exc:
            raise GatewayError(503, f"Could not store the change in Redis: {type(exc).__name__}.",
                               "state_unavailable") from None
        return JSONResponse(gw.team_view(name))

    async def state(request: Request) -> Response:
        _authorize(gw, request)
        return JSONResponse(_holding(gw, gw.state_view()))

    return [
        Route("/admin/teams/{team}", get_team, methods=["GET"]),
        Route("/admin/teams/{team}", put_team, methods=["PUT"]),
        Route("/admin/state", state, methods=["GET"]),
    ]


def _pending_leases(gw: Gateway) -> dict[str, int]:
    counts: dict[str, int] = {}
    for team in getattr(gw.dispatcher, "leasing", {}).values():
        counts[team] = counts.get(team, 0) + 1
    return counts


def _holding(gw: Gateway, view: dict[str, Any]) -> dict[str, Any]:
    """In flight = holding a slot: requests the core dispatched that still wait for their Redis lease
    are shown as ``waiting_for_lease``, not in flight."""
    pending = _pending_leases(gw)
    core = view.get("core") or {}
    teams = core.get("teams") or {}
    for team, n in pending.items():
        if team in teams:
            teams[team]["inflight"] = max(0, teams[team]["inflight"] - n)
            teams[team]["waiting_for_lease"] = n
    if "running" in core:
        core["running"] = max(0, core["running"] - sum(pending.values()))
    core["waiting_for_lease"] = sum(pending.values())
    return view


def _holding_team(gw: Gateway, view: dict[str, Any]) -> dict[str, Any]:
    n = _pending_leases(gw).get(view["team"], 0)
    view["inflight"] = max(0, view["inflight"] - n)
    view["waiting_for_lease"] = n
    return view


def describe_limits(limits: Any) -> dict[str, Any]:
    return {f: getattr(limits, f) for f in TEAM_FIELDS}
