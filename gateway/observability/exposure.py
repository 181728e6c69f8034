"""Who may read the gateway's own endpoints, and ``/metrics`` on a port of its own.

With ``endpoints.require_key``, ``/metrics``, ``/v1/models`` and ``/readyz``'s details need a team key
or the admin token (team and backend names are not for anyone who reaches the port); ``/readyz``
without one still answers its status code, so load balancers need no key. With
``endpoints.metrics_port``, ``/metrics`` is served on that port only (404 on the main one), by
prometheus-client's ASGI app on a uvicorn server in the same event loop (``MetricsServer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import TYPE_CHECKING

import uvicorn
from prometheus_client import make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.http.errors import GatewayError

if TYPE_CHECKING:
    from gateway.worker import Gateway

log = logging.getLogger("cachegate")


def may_see(gw: Gateway, request: Request) -> bool:
    """Whether the caller may see details (always, unless ``endpoints.require_key``)."""
    return not gw.config.endpoints.require_key or gw.keys.allowed(request.headers, gw.admin_token)


def guard(gw: Gateway, request: Request, *, metrics: bool = False) -> None:
    """Raise 404 for ``/metrics`` moved to its own port, 401 when a key is required and missing."""
    if metrics and gw.config.endpoints.metrics_port is not None:
        raise GatewayError(404, f"Metrics are served on port {gw.config.endpoints.metrics_port}.", "unknown_url")
    if not may_see(gw, request):
        raise GatewayError(401, "This endpoint needs an API key or the admin token.", "missing_api_key")


class _Guarded:
    """prometheus-client's ASGI app behind the key rule (an ASGI app: Starlette routes to it as is)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.metrics = make_asgi_app(gw.metrics.exposed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not may_see(self.gw, Request(scope)):
            denied = PlainTextResponse("This endpoint needs an API key or the admin token.\n", 401)
            await denied(scope, receive, send)
            return
        await self.metrics(scope, receive, send)


class MetricsServer:
    """``GET /metrics`` on ``endpoints.metrics_port``: prometheus-client's ASGI app behind the same key
    rule, served by a uvicorn server of its own on the worker's event loop. Its socket is bound with
    ``SO_REUSEPORT``, so every worker may bind it (multiprocess metrics are the same from any of them).
    It shares the process's signal handling with the main server (uvicorn hands a signal it caught on to
    the handlers it replaced), and neither touches the process's logging set-up."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/metrics", _Guarded(self.gw), methods=["GET"])])

    async def start(self) -> None:
        port = self.gw.config.endpoints.metrics_port
        if port is None:
            return
        host = self.gw.config.listen.host
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        config = uvicorn.Config(
            self.app(),
            lifespan="off",
            log_config=None,
            access_log=False,
            http="h11",
            timeout_keep_alive=5,
            h11_max_incomplete_event_size=16 * 1024,
        )
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]), name="metrics-port")
        while not self.server.started and not self.task.done():
            await asyncio.sleep(0.01)
        if self.task.done():
            self.task.result()  # raises what kept it from starting
        log.info("metrics on http://%s:%d/metrics", host, port)

    async def stop(self) -> None:
        if self.server is None or self.task is None:
            return
        self.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.task, 5)
