"""The access log and the per-route request count: one line and one count per HTTP request.

``AccessLog`` wraps the whole ASGI app, so every request is seen (unknown routes, 401s, refusals,
clients that left) and counted in ``cachegate_http_requests_total{method, route, status}``, where
``route`` is the matched route template (``/v1/models/{model:path}``) or ``unknown``: a bounded
label whatever clients send. The request path fills the request's ``AccessRecord`` (team,
backend, queue wait, time to first token, refusal code).

Lines go to the logger ``cachegate.access`` at INFO: ``text`` (key=value) or ``json`` (one object
per line, nothing around it), chosen by ``access_log`` in the config or ``--access-log``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import orjson
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.metrics import Metrics

log = logging.getLogger("cachegate.access")

AccessFormat = Literal["text", "json", "off"]
SCOPE_KEY = "cachegate.access"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


@dataclass(slots=True)
class AccessRecord:
    """One request as the access log shows it (the request path fills the middle fields)."""

    method: str = ""
    route: str = "unknown"
    path: str = ""
    status: int = 0
    team: str = ""
    backend: str = ""
    refusal: str = ""
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    duration_s: float = 0.0

    def text(self) -> str:
        # One f-string with the optional fields spliced in (not a list joined): once per request.
        return (
            f"{self.method} {self.path} status={self.status} route={self.route}"
            f"{f' team={self.team}' if self.team else ''}"
            f"{f' backend={self.backend}' if self.backend else ''}"
            f"{f' refusal={self.refusal}' if self.refusal else ''}"
            f"{f' queue_wait_s={self.queue_wait_s:.3f}' if self.queue_wait_s is not None else ''}"
            f"{f' ttft_s={self.ttft_s:.3f}' if self.ttft_s is not None else ''}"
            f" duration_s={self.duration_s:.3f}"
        )

    def json(self) -> str:
        fields = {
            "method": self.method,
            "route": self.route,
            "path": self.path,
            "status": self.status,
            "team": self.team,
            "backend": self.backend,
            "refusal": self.refusal,
            "queue_wait_s": self.queue_wait_s,
            "ttft_s": self.ttft_s,
            "duration_s": self.duration_s,
        }
        return orjson.dumps({k: v for k, v in fields.items() if v is not None and v != ""}).decode()


def access_record(scope: Scope) -> AccessRecord:
    """The request's record (a throwaway one when the app runs without ``AccessLog``)."""
    record = scope.get(SCOPE_KEY)
    return record if isinstance(record, AccessRecord) else AccessRecord()


def route_template(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The template of the route ``scope`` matches (even on the wrong method), else ``unknown``."""
    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE and isinstance(route, Route):
            return route.path
    return "unknown"


_JSON_HANDLER = logging.StreamHandler(sys.stderr)
_JSON_HANDLER.setFormatter(logging.Formatter("%(message)s"))


def configure_access_log(fmt: AccessFormat) -> None:
    """``json``: lines are bare JSON objects on stderr (not inside the root handler's format)."""
    if fmt == "json":
        if _JSON_HANDLER not in log.handlers:
            log.addHandler(_JSON_HANDLER)
    else:
        log.removeHandler(_JSON_HANDLER)
    log.propagate = fmt != "json"
    log.setLevel(logging.INFO)


class AccessLog:
    """ASGI middleware: records, logs and counts every HTTP request."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Sequence[BaseRoute],
        metrics: Metrics,
        fmt: AccessFormat = "text",
        self_reporting: Collection[str] = (),
    ) -> None:
        self.app = app
        self.routes = routes
        self.metrics = metrics
        self.fmt = fmt
        self._static: dict[str, str] = {}
        """Paths that matched a route without parameters (the template is the path itself): their
        template without walking the routes again (2% of a short request). Bounded by the routes."""
        self.self_reporting = frozenset(self_reporting)
        """Paths whose POST endpoint sets ``AccessRecord.status`` itself (the request path, the overload
        guard): their ``send`` is not wrapped, which would cost a frame per relayed chunk."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = str(scope["method"])
        path = str(scope["path"])
        route = self._static.get(path)
        if route is None:
            route = route_template(self.routes, scope)
            if route == path:
                self._static[path] = route
        record = AccessRecord(method=method, route=route, path=path)
        scope[SCOPE_KEY] = record
        started = time.monotonic()

        async def send_seen(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = int(message["status"])
            await send(message)

        try:
            direct = method == "POST" and record.path in self.self_reporting
            await self.app(scope, receive, send if direct else send_seen)
        finally:
            record.duration_s = time.monotonic() - started
            status = record.status or 499  # 499: the client left before any answer
            record.status = status
            self.metrics.http_requests.labels(method if method in METHODS else "OTHER", record.route, str(status)).inc()
            if self.fmt != "off" and log.isEnabledFor(logging.INFO):
                line = record.json() if self.fmt == "json" else record.text()
                # handle() a record made here: log.info() would also walk the stack for the caller's
                # file and line, which no access-log format shows.
                log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, line, (), None))
