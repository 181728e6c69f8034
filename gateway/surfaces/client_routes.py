"""The client routes that are not generations, so take no admission: ``GET /v1/models`` (+ one
model), ``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``,
``POST /v1/messages/count_tokens``, ``HEAD /`` and ``GET /`` (Claude Code's reachability check).

Each checks the caller's key like the generation routes (when keys are configured) and answers
errors in its surface's envelope. The model list carries each model's context window
(``max_model_len``: the smallest any of its backends reported) and the alias names a client may
ask for (``aliases``; glob patterns are not listed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.http.errors import GatewayError, error_response
from gateway.observability import exposure
from gateway.observability.access import access_record
from gateway.surfaces.translate import messages as ms

if TYPE_CHECKING:  # the worker sits above the surfaces: its type only
    from gateway.worker import Gateway

GLOB = frozenset("*?[")


def _team(gw: Gateway, request: Request) -> str:
    team = gw.keys.team_for(request.headers)
    access_record(request.scope).team = team
    return team


def _context(gw: Gateway, alias: str) -> int | None:
    lengths = [b.max_model_len for b in (gw.pool.models.get(alias, []) if gw.pool else []) if b.max_model_len]
    return min(lengths) if lengths else None


def _card(gw: Gateway, name: str, alias: str) -> dict[str, Any]:
    card: dict[str, Any] = {"id": name, "object": "model", "created": gw.started_at, "owned_by": "cachegate"}
    length = _context(gw, alias)
    if length:
        card["max_model_len"] = length
        card["context_window"] = length
    if name != alias:
        card["alias_of"] = alias
    return card


def _names(gw: Gateway) -> dict[str, str]:
    """Every name a client may ask for → its model."""
    names = {alias: alias for alias in gw.config.models}
    names.update({n: t for n, t in gw.config.aliases.items() if not GLOB & set(n)})
    return names


def routes(gw: Gateway) -> list[Route]:
    async def models(request: Request) -> Response:
        exposure.guard(gw, request)  # endpoints.require_key: closed to anonymous callers even without team keys
        _team(gw, request)
        return JSONResponse({"object": "list", "data": [_card(gw, n, a) for n, a in _names(gw).items()]})

    async def model(request: Request) -> Response:
        exposure.guard(gw, request)
        _team(gw, request)
        name = request.path_params["model"]
        alias = gw.config.resolve_model(name)
        if alias is None:
            raise GatewayError(404, f"The model '{name}' does not exist.", "model_not_found", "model")
        return JSONResponse(_card(gw, name, alias))

    async def get_response(request: Request) -> Response:
        team = _team(gw, request)
        rid = request.path_params["response_id"]
        record = await gw.responses.store.get(rid, team)
        if record is None:
            raise GatewayError(404, f"No response found with id '{rid}'.", "response_not_found")
        return Response(orjson.dumps({**record.response, "status": record.status}), media_type="application/json")

    async def cancel_response(request: Request) -> Response:
        team = _team(gw, request)
        rid = request.path_params["response_id"]
        record = await gw.responses.store.cancel(rid, team)
        if record is None:
            raise GatewayError(404, f"No response found with id '{rid}'.", "response_not_found")
        if record.status != "cancelled":
            raise GatewayError(
                400, f"Cannot cancel a response with status '{record.status}'.", "response_not_cancellable"
            )
        gw.responses.cancel_local(rid)
        return Response(orjson.dumps({**record.response, "status": "cancelled"}), media_type="application/json")

    async def count_tokens(request: Request) -> Response:
        try:
            _team(gw, request)
            body = ms.load_body(await request.body())
            if gw.config.resolve_model(str(body.get("model") or "")) is None:
                raise GatewayError(404, f"The model '{body.get('model')}' does not exist.", "model_not_found")
            return JSONResponse(ms.count_tokens(body, gw.estimator.ratio))
        except GatewayError as err:
            headers = {**err.headers, **({"x-cachegate-code": err.code} if err.code else {})}
            return Response(
                ms.error_body(err.status, err.message, err.code),
                err.status,
                headers=headers,
                media_type="application/json",
            )

    async def root(request: Request) -> Response:
        if request.method == "HEAD":
            return Response(status_code=200)
        return JSONResponse(
            {
                "service": "cachegate",
                "routes": ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/models"],
            }
        )

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/", root, methods=["GET", "HEAD"]),
    ]


__all__ = ["error_response", "routes"]
