"""The Starlette application: which route goes where, start-up and shut-down. Nothing else.

The client surfaces (``default_surfaces``) all run the one request path (``gateway/request/lifecycle.py``); the
admin API is ``gateway/admin.py``; a worker's parts are ``gateway/worker.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway import admin
from gateway.config.logsetup import configure_logging
from gateway.config.schema import Config
from gateway.http.errors import GatewayError, error_response
from gateway.http.gcpause import quiet_gc
from gateway.observability import exposure
from gateway.observability.access import AccessLog
from gateway.observability.metrics import Metrics
from gateway.request.lifecycle import RequestPath
from gateway.request.overload import OverloadGuard
from gateway.surfaces.base import Surface
from gateway.surfaces.chat import CHAT, COMPLETIONS
from gateway.surfaces.client_routes import routes as client_routes
from gateway.surfaces.messages import MessagesSurface
from gateway.surfaces.responses import ResponsesSurface
from gateway.worker import Gateway

log = logging.getLogger("cachegate")


def default_surfaces() -> tuple[Surface, ...]:
    """Every client surface on the request path (``gateway/surfaces/base.py`` says how to add one); new
    instances per app, since the Responses surface holds a worker's store and running streams."""
    return (CHAT, COMPLETIONS, ResponsesSurface(), MessagesSurface())


ALSO_AT = {"/v1/messages": "/messages"}
"""Second paths of a surface: Anthropic base URLs given with ``/v1`` make SDKs post ``/v1/messages``
there, others (opencode) post ``/messages``."""


def create_app(
    config: Config,
    metrics: Metrics | None = None,
    admin_token: str | None = None,
    surfaces: Sequence[Surface] | None = None,
) -> Starlette:
    """The app for one worker; ``surfaces`` are the client APIs on the request path. Every route runs
    the one middleware chain: Starlette's error middleware, the access log, the overload guard (which
    hands a surface's POST to its ``RequestPath`` without the router), the exception handlers."""
    gw = Gateway(config, metrics, admin_token)
    surfaces = default_surfaces() if surfaces is None else tuple(surfaces)
    if not any(isinstance(s, ResponsesSurface) for s in surfaces):
        surfaces = (*surfaces, ResponsesSurface())  # GET/cancel need a store even when not posted to
    for surface in surfaces:
        surface.bind(gw)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        backends = {
            b.name: {"healthy": b.healthy, "model": b.model, "error": b.last_error or None}
            for b in (gw.pool.all() if gw.pool else [])
        }
        ready = gw.pool is not None and gw.pool.any_healthy()
        if not exposure.may_see(gw, request):
            return JSONResponse({"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503)
        return JSONResponse(
            {"status": "ready" if ready else "not ready", "backends": backends, "state": gw.state.status()},
            status_code=200 if ready else 503,
        )

    async def metrics_endpoint(request: Request) -> Response:
        exposure.guard(gw, request, metrics=True)
        body, content_type = gw.metrics.exposition(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            err = GatewayError(404, f"Unknown request URL: {request.method} {request.url.path}", "unknown_url")
        elif exc.status_code == 405:
            err = GatewayError(
                405, f"Method {request.method} is not allowed on {request.url.path}.", "method_not_allowed"
            )
        else:
            err = GatewayError(exc.status_code, str(exc.detail), None)
        return error_response(err)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(GatewayError(500, "Internal server error.", "internal_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        metrics_server = exposure.MetricsServer(gw)
        await metrics_server.start()
        quiet_gc()
        try:
            yield
        finally:
            await metrics_server.stop()
            await gw.stop()
            for surface in surfaces:
                await surface.close()

    # The surfaces' endpoints, handed their POSTs by the overload guard (gateway/request/overload.py) directly.
    direct = {path: RequestPath(gw, s) for s in surfaces for path in (s.path, ALSO_AT.get(s.path)) if path}
    routes = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in direct.items()),
        *client_routes(gw),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *admin.routes(gw),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(AccessLog, routes=routes, metrics=gw.metrics, fmt=config.access_log, self_reporting=direct),
            Middleware(OverloadGuard, overload=gw.overload, on_shed=gw.shed, direct=direct),
        ],
        exception_handlers={GatewayError: on_gateway_error, HTTPException: on_http_error, Exception: on_crash},
    )
    app.state.gateway = gw
    return app


def app_from_env() -> Starlette:
    """Factory for ``--workers N``: each worker process rebuilds the app from the serialised config."""
    config = Config.model_validate_json(os.environ["CACHEGATE_CONFIG_JSON"])
    configure_logging(config)
    return create_app(config)
