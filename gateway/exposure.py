"""Who may read the gateway's own endpoints, and ``/metrics`` on a port of its own.

With ``endpoints.require_key``, ``/metrics``, ``/v1/models`` and ``/readyz``'s details need a team key
or the admin token (team and backend names are not for anyone who reaches the port); ``/readyz``
without one still answers its status code, so load balancers need no key. With
``endpoints.metrics_port``, ``/metrics`` is served on that port only (404 on the main one), by a
minimal HTTP/1.1 server in the same event loop (``SO_REUSEPORT``, so every worker may bind it:
multiprocess metrics are the same from any of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from starlette.requests import Request

from gateway.errors import GatewayError

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


class MetricsServer:
    """``GET /metrics`` on ``endpoints.metrics_port`` (the same key rule applies)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        port = self.gw.config.endpoints.metrics_port
        if port is None:
            return
        self.server = await asyncio.start_server(
            self._handle, self.gw.config.listen.host, port, reuse_port=True, limit=16 * 1024
        )
        log.info("metrics on http://%s:%d/metrics", self.gw.config.listen.host, port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.gw.config.server.header_timeout_s)
            lines = head.decode("latin-1").split("\r\n")
            method, path, *_ = [*lines[0].split(" "), "", ""]
            headers = [
                (k.strip().lower().encode("latin-1"), v.strip().encode("latin-1"))
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            ]
            request = Request({"type": "http", "headers": headers, "method": method, "path": path})
            if method != "GET" or path.split("?")[0] != "/metrics":
                status, body, ctype = b"404 Not Found", b"not found\n", "text/plain"
            elif not may_see(self.gw, request):
                status, body, ctype = b"401 Unauthorized", b"this endpoint needs an API key\n", "text/plain"
            else:
                status = b"200 OK"
                body, ctype = self.gw.metrics.exposition(request.headers.get("accept", ""))
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\ncontent-type: "
                + ctype.encode()
                + b"\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\nconnection: close\r\n\r\n"
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
