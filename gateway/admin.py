"""The admin API under ``/admin/`` on the gateway's port: read and change team limits at run
time, see queues and in-flight work. Off unless an admin token is configured; every call needs
``Authorization: Bearer <token>`` (compared in constant time), else 401."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.config.schema import TeamConfig
from gateway.http.errors import GatewayError
from gateway.request.auth import check_token
from gateway.worker import Gateway
from policies.admission import SeatedAdmission, SeatParams
from policies.teams import TeamLimits
from policies.types import BackendView

TEAM_FIELDS = set(TeamConfig.model_fields)


def _authorize(gw: Gateway, request: Request) -> None:
    if not gw.admin_token:
        raise GatewayError(
            404,
            f"The admin API is off: start the gateway with --admin-token or ${gw.config.admin_token_env}.",
            "admin_disabled",
        )
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not check_token(token.strip(), gw.admin_token):
        raise GatewayError(401, "Missing or wrong admin token.", "invalid_admin_token")


# ----- views ---------------------------------------------------------------------------------------


def team_limits(gw: Gateway, name: str) -> dict[str, Any]:
    """The limits in force for team ``name`` (runtime changes over the config's, or the default's)."""
    state = gw.core.teams.get(name)
    limits = gw.core.limits.get(name)
    if limits is None and state is not None:
        limits = state.limits
    if limits is None:
        cfg = gw.config.teams.get(name) or gw.config.teams["default"]
        return cfg.model_dump()
    return describe_limits(limits)


def team_view(gw: Gateway, name: str) -> dict[str, Any]:
    state = gw.core.teams.get(name)
    return {
        "team": name,
        "limits": team_limits(gw, name),
        "inflight": state.inflight if state else 0,
        "waiting": state.waiting if state else 0,
    }


def seat_budget(gw: Gateway, view: BackendView) -> int | None:
    """Tokens the admission seats of one rank of ``view`` may reserve: ``admit_water`` × its capacity
    (GPU pool plus ``host_water`` × a host tier it reloads from; ``policies/admission/sizing.py``), for
    this replica before its share. None: a stack without seats, or an unknown capacity."""
    if not isinstance(gw.core, SeatedAdmission) or not view.kv_tokens:
        return None
    params = SeatParams(**gw.config.admission)
    capacity = view.kv_tokens
    if view.host_tokens and view.reload_tokens_per_s > 0:
        capacity = int(view.kv_tokens + params.host_water * view.host_tokens)
    return int(params.admit_water * capacity)


def state_view(gw: Gateway) -> dict[str, Any]:
    backends = {
        b.name: {
            "model": b.model,
            "engine": b.engine,
            "healthy": b.healthy,
            "running": b.running,
            "waiting": b.waiting,
            "token_usage": b.token_usage,
            "max_total_num_tokens": b.max_total_num_tokens,
            "capacity": {
                "kv_tokens_per_rank": b.max_total_num_tokens,
                "ranks": b.dp_size,
                "source": b.capacity_source or None,
                "max_running_requests": b.max_running_requests,
                "context_tokens": b.max_model_len,
                "seat_budget_tokens": seat_budget(gw, b.view()),
                "learned": None
                if b.limiter is None
                else {
                    "limit": round(b.limiter.limit, 2),
                    "samples": b.limiter.samples,
                    "inflight": b.inflight,
                },
            },
        }
        for b in (gw.pool.all() if gw.pool else [])
    }
    return {
        "policy": gw.config.policy,
        "state": gw.state.status(),
        "core": gw.core.snapshot(),
        "backends": backends,
        "waiting": gw.dispatcher.waiting,
        "kv_events": gw.kv.status() if gw.kv is not None else None,
    }


def describe_limits(limits: TeamLimits) -> dict[str, Any]:
    return {f: v for f, v in dataclasses.asdict(limits).items() if f in TEAM_FIELDS}


# ----- routes --------------------------------------------------------------------------------------


def routes(gw: Gateway) -> list[Route]:
    async def get_team(request: Request) -> Response:
        _authorize(gw, request)
        name = request.path_params["team"]
        return JSONResponse(_holding_team(gw, team_view(gw, name)))

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
            raise GatewayError(
                400,
                f"Unknown team field(s): {', '.join(unknown)}; known: {', '.join(sorted(TEAM_FIELDS))}.",
                "invalid_request",
                unknown[0],
            )
        current = team_limits(gw, name)
        try:
            merged = TeamConfig.model_validate({**current, **body})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise GatewayError(
                400, f"Invalid team limits: {first['msg']}.", "invalid_request", ".".join(str(p) for p in first["loc"])
            ) from None
        try:
            await gw.state.set_team(name, merged.model_dump())
        except (RedisError, OSError) as exc:
            raise GatewayError(
                503, f"Could not store the change in Redis: {type(exc).__name__}.", "state_unavailable"
            ) from None
        return JSONResponse(team_view(gw, name))

    async def state(request: Request) -> Response:
        _authorize(gw, request)
        return JSONResponse(_holding(gw, state_view(gw)))

    return [
        Route("/admin/teams/{team}", get_team, methods=["GET"]),
        Route("/admin/teams/{team}", put_team, methods=["PUT"]),
        Route("/admin/state", state, methods=["GET"]),
    ]


def _pending_leases(gw: Gateway) -> dict[str, int]:
    counts: dict[str, int] = {}
    for team in gw.dispatcher.leasing.values():
        counts[team] = counts.get(team, 0) + 1
    return counts


def _holding(gw: Gateway, view: dict[str, Any]) -> dict[str, Any]:
    """In flight = holding a slot: requests the core dispatched that still wait for their Redis lease
    are shown as ``waiting_for_lease``, not in flight."""
    pending = _pending_leases(gw)
    snap = view.get("core") or {}
    teams = snap.get("teams") or {}
    for team, n in pending.items():
        if team in teams:
            teams[team]["inflight"] = max(0, teams[team]["inflight"] - n)
            teams[team]["waiting_for_lease"] = n
    if "running" in snap:
        snap["running"] = max(0, snap["running"] - sum(pending.values()))
    snap["waiting_for_lease"] = sum(pending.values())
    return view


def _holding_team(gw: Gateway, view: dict[str, Any]) -> dict[str, Any]:
    n = _pending_leases(gw).get(view["team"], 0)
    view["inflight"] = max(0, view["inflight"] - n)
    view["waiting_for_lease"] = n
    return view
