"""Load shedding: a worker that falls behind refuses NEW requests early, and says so honestly.

Two signals, both local to one worker:

- **event-loop lag**: a timer every ``interval_ms`` measures how late its callback runs; the
  worker is behind while the average over about ``window_s`` (an exponential moving average, time
  weighted) exceeds ``max_lag_ms``. A single slow tick (a burst of connections) sheds nothing; a
  loop that stays behind sheds until it has caught up.
- **requests in flight** (``max_inflight``, off by default): completions requests this worker holds,
  waiting for a seat or relaying. Beyond it, new ones are shed.

A shed request gets 503 with ``Retry-After`` and code ``overloaded`` in its surface's envelope
(``Sheddable.overloaded``: the surface's own error renderer) before its body is read (the cheapest
refusal there is). Streams already relaying are never cut:
they slow down with the loop. ``lagging()`` also tells the failure classification
(backends/failures.py) that a timeout that fired now is the worker's fault, not the backend's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config.schema import OverloadConfig
from gateway.http.errors import error_body
from gateway.observability.access import access_record

log = logging.getLogger("cachegate.overload")
SHED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
CODE = "overloaded"
MESSAGE = "This gateway worker is overloaded; retry shortly."


class Overload:
    """The worker's own load: loop lag (from the monitor's timer) and requests in flight."""

    def __init__(self, config: OverloadConfig) -> None:
        self.config = config
        self.lag_s = 0.0
        self.avg_lag_s = 0.0
        self.max_lag_s = 0.0
        self.late_until = 0.0
        self.last_tick = time.monotonic()
        self.inflight = 0
        self.shed = 0
        self.last_shed = -1e9
        self._timer: asyncio.TimerHandle | None = None
        self._tick_started = 0.0

    def start(self) -> None:
        """Measure the loop's lag every ``interval_ms``: a timer callback, not a task that sleeps
        (no task, future and task step per tick, twenty ticks a second at the default 50 ms: with the
        dispatcher's idle ticks, a large share of an idle worker's CPU; ``loadtest/bench/instr.py`` prints
        the idle rate, docs/benchmarks.md "The short request" the cost per request)."""
        loop = asyncio.get_running_loop()
        self._tick_started = loop.time()
        self._timer = loop.call_at(self._tick_started + self.config.interval_ms / 1000, self._tick, loop)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self, loop: asyncio.AbstractEventLoop) -> None:
        # Measured one step later, where a task woken by this timer would run (as asyncio.sleep's
        # waker): the lag includes the loop turn that wake-up waits for.
        loop.call_soon(self._measure, loop)

    def _measure(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is None:
            return  # stopped
        interval = self.config.interval_ms / 1000
        now = loop.time()
        elapsed = now - self._tick_started
        self.observe(elapsed - interval, elapsed)
        self._tick_started = now
        self._timer = loop.call_at(now + interval, self._tick, loop)

    def observe(self, lag_s: float, elapsed_s: float, now: float | None = None) -> None:
        """One measurement: the loop ran ``lag_s`` late over a tick of ``elapsed_s`` (monitor or test)."""
        self.last_tick = time.monotonic() if now is None else now
        self.lag_s = max(0.0, lag_s)
        self.max_lag_s = max(self.max_lag_s, self.lag_s)
        self.avg_lag_s += (self.lag_s - self.avg_lag_s) * min(1.0, elapsed_s / self.config.window_s)
        if self.lag_s * 1000 > self.config.max_lag_ms:
            self.late_until = (time.monotonic() if now is None else now) + self.config.hold_s

    def behind(self) -> bool:
        """Whether the loop has been late on average: new requests would only make it worse."""
        return self.avg_lag_s * 1000 > self.config.max_lag_ms

    def lagging(self, now: float | None = None) -> bool:
        """Whether the loop ran late (past ``max_lag_ms``) within ``hold_s``: deadlines passing now
        prove nothing about the backend. Also true while the monitor itself is overdue: a stalled loop
        may run a timeout's callback before the monitor has measured the stall."""
        now = time.monotonic() if now is None else now
        overdue = now - self.last_tick > (self.config.interval_ms + self.config.max_lag_ms) / 1000
        return now < self.late_until or (self._timer is not None and overdue)

    def reason(self) -> str | None:
        """Why a new request would be shed now, or None to admit it."""
        if self.behind():
            return f"event loop {self.avg_lag_s * 1000:.0f} ms behind on average"
        cap = self.config.max_inflight
        if cap is not None and self.inflight >= cap:
            return f"{self.inflight} requests in flight"
        return None

    def refusal(self, path: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """Headers and body of a 503 ``overloaded`` in the envelope of the surface at ``path``."""
        message = MESSAGE
        if path.startswith("/v1/messages"):
            body = orjson.dumps({"type": "error", "error": {"type": "overloaded_error", "message": message}})
        else:
            body = error_body(503, message, CODE)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(self.config.retry_after_s).encode()),
            (b"x-cachegate-code", CODE.encode()),
        ]
        return headers, body


Reply = tuple[list[tuple[bytes, bytes]], bytes]


class Sheddable(Protocol):
    """A raw ASGI endpoint the guard hands requests to, and that renders its own 503."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None: ...

    def overloaded(self, message: str, retry_after_s: int) -> Reply:
        """Headers and body of a 503 ``overloaded`` in this endpoint's envelope."""
        ...


class OverloadGuard:
    """ASGI middleware: sheds new requests on the client surfaces while the worker is behind, counts
    the rest.

    ``direct``: the client surfaces' raw ASGI endpoints (path → endpoint); a POST to one of these
    paths is what gets shed (in the endpoint's envelope), and otherwise is handed to the endpoint
    straight away, skipping the router and exception middleware layers that cost a coroutine frame
    per response chunk; they answer their own errors (a crash still reaches the outer error
    middleware). Without ``direct``, POSTs under ``SHED_PATHS`` are shed in OpenAI's envelope
    (Anthropic's on /v1/messages)."""

    def __init__(
        self,
        app: ASGIApp,
        overload: Overload,
        on_shed: Callable[[Headers, str], None],
        direct: Mapping[str, Sheddable] | None = None,
    ) -> None:
        self.app = app
        self.overload = overload
        self.on_shed = on_shed
        self.direct = direct or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = self.direct.get(path)
        if endpoint is None and (self.direct or not path.startswith(SHED_PATHS)):
            await self.app(scope, receive, send)
            return
        ov = self.overload
        reason = ov.reason()
        if reason is not None:
            now = time.monotonic()
            if now - ov.last_shed > 10:  # once per episode, not once per request
                log.warning("shedding new requests: %s (%d in flight)", reason, ov.inflight)
            ov.last_shed = now
            ov.shed += 1
            self.on_shed(Headers(scope=scope), reason)
            headers, body = (
                ov.refusal(path)
                if endpoint is None
                else endpoint.overloaded(MESSAGE, self.overload.config.retry_after_s)
            )
            access_record(scope).status = 503  # the access log does not watch a direct route's sends
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        ov.inflight += 1
        try:
            await (self.app if endpoint is None else endpoint)(scope, receive, send)
        finally:
            ov.inflight -= 1
