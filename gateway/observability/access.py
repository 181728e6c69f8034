"""The access log and the per-route request count: one line and one count per HTTP request.

``AccessLog`` wraps the whole ASGI app, so every request is seen (unknown routes, 401s, refusals,
clients that left) and counted in ``cachegate_http_requests_total{method, route, status}``, where
``route`` is the matched route template (``/v1/models/{model:path}``) or ``unknown``: a bounded
label whatever clients send. The request path fills the request's ``AccessRecord`` (team,
backend, queue wait, time to first token, refusal code).

Lines go to stderr, written here (one ``write`` of one line each, stderr being line-buffered), not
through Python's ``logging``: a record made, filtered, formatted and handled per request was a large
share of a short request's CPU (what the access log costs now: docs/benchmarks.md, "The short
request"). ``text`` lines keep the other log lines' layout (``2026-12-01 09:28:39,895 INFO
cachegate.access: POST /v1/... status=200 ...``); ``json`` lines are one bare object each;
``access_log`` in the config or ``--access-log`` chooses, ``off`` silences.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

import orjson
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.observability.metrics import Metrics

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


class _Clock:
    """``logging``'s default time stamp (``%Y-%m-%d %H:%M:%S,mmm``, local time), its seconds part
    formatted once a second (a time zone's offset only changes on a whole second)."""

    __slots__ = ("second", "text")

    def __init__(self) -> None:
        self.second = -1
        self.text = ""

    def stamp(self, now: float) -> str:
        second = int(now)
        if second != self.second:
            self.second, self.text = second, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        return f"{self.text},{int((now - second) * 1000):03d}"


_CLOCK = _Clock()


def write_line(record: AccessRecord, fmt: AccessFormat) -> None:
    """One access-log line on stderr (looked up per line: a test's capture, or a reopened stream)."""
    if fmt == "json":
        sys.stderr.write(record.json() + "\n")
    elif fmt == "text":
        sys.stderr.write(f"{_CLOCK.stamp(time.time())} INFO cachegate.access: {record.text()}\n")


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
        template without walking the routes again (a walk on every request otherwise). Bounded by the routes."""
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

        try:
            if method == "POST" and path in self.self_reporting:
                await self.app(scope, receive, send)
            else:

                async def send_seen(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        record.status = int(message["status"])
                    await send(message)

                await self.app(scope, receive, send_seen)
        finally:
            record.duration_s = time.monotonic() - started
            status = record.status or 499  # 499: the client left before any answer
            record.status = status
            self.metrics.http_requests.labels(method if method in METHODS else "OTHER", record.route, str(status)).inc()
            if self.fmt != "off":
                write_line(record, self.fmt)
