"""The upstream attempts of one dispatched request: send it to the chosen backend, retry once
elsewhere when nothing reached it, relay the answer through the surface's relay.

``Upstream.forward`` fills an ``Exchange`` as it goes, so that a request cancelled mid-way (its
client left) still says whether an engine received it: ``reached_backend`` turns true when an
attempt starts and back to false only when the attempt failed before anything reached the
backend (connection refused or timed out, connection dropped before an answer) or the worker's
own upstream connection budget was full. The decision core keeps a conversation's seat on a
backend that received the turn (its cache is there) and gives it back otherwise.

Requests go out on the lean client (``gateway/http/wire.py``), every surface alike. Only the backend's
own failures count against it (``backends/failures.py``): a full connection budget is the worker's
overload (503 ``overloaded`` + ``Retry-After``, no retry, nobody blamed), and a timeout that fired
while the event loop lagged (``Overload.lagging``) proves nothing about the backend. A response
that is not valid HTTP (``UpstreamMalformed``) is a 502 ``upstream_malformed_response``, not retried
(the backend had the request), logged, counted (``kind="malformed"``) and blamed on the backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from starlette.types import Send

from backends.failures import STREAM_BROKEN, backend_fault, stream_fault
from backends.pool import Backend, BackendPool
from gateway.http.errors import GatewayError
from gateway.http.wire import UpstreamMalformed
from gateway.http.wire_pool import WireClient
from gateway.observability.metrics import Metrics
from gateway.observability.spans import UpstreamSpan
from gateway.observability.telemetry import RequestTrace
from gateway.relay.events import MALFORMED
from gateway.relay.proxy import BODY_LIMIT, RETRYABLE, Result, read_body
from gateway.request.dispatch import Dispatcher
from gateway.request.pd_hop import PdHop, PrefillFailed, PrefillLeg, PrefillRefused
from gateway.surfaces.base import ClientRequest, RelayContext, Surface, Target
from policies.types import Dispatch

BROKEN = ("timeout", "stream_broken", "malformed")

AttemptEnd = Literal["answered", "unreached", "failed", "refused"]
"""How one attempt ended: an answer was relayed; nothing reached the backend (retry elsewhere); the
backend got the request and the attempt failed (``Exchange.error`` says how); or the worker refused
it itself (no upstream connection free: ``Exchange.error`` is 503 ``overloaded``)."""

OVERLOADED = "overloaded"
MALFORMED_MESSAGE = "The backend sent a malformed HTTP response."

log = logging.getLogger("cachegate")


@dataclass(slots=True)
class Exchange:
    """What the upstream attempts came to (filled in as they go)."""

    result: Result = field(default_factory=Result)
    backend: str = ""
    """The backend of the last attempt."""
    status: int = 0
    """Status of the upstream answer relayed to the client (0: none was)."""
    reached_backend: bool = False
    """The engine received the request (or may have: a cancelled attempt counts as received)."""
    error: GatewayError | None = None
    """The gateway's own error to answer (502/504), when no upstream answer was relayed."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None and self.result.stream_error is None

    @property
    def refused(self) -> bool:
        """The engine refused the request (a 4xx answer relayed): it holds nothing there, so its seat
        goes at once (``Outcome.refused``)."""
        return 400 <= self.status < 500


class Upstream:
    """The upstream hop of one worker: its HTTP client, the pool, and what learns from failures.

    ``lagging()`` says whether the worker's event loop ran late just now (``Overload.lagging``);
    ``retry_after_s`` goes with a 503 ``overloaded``."""

    def __init__(
        self,
        client: WireClient,
        pool: BackendPool,
        dispatcher: Dispatcher,
        metrics: Metrics,
        keepalive_s: float,
        lagging: Callable[[], bool] = lambda: False,
        retry_after_s: int = 1,
        prefill_timeout_s: float = 60.0,
    ) -> None:
        self.client = client
        self.pool = pool
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.keepalive_s = keepalive_s
        self.lagging = lagging
        self.retry_after_s = retry_after_s
        self.pd = PdHop(client, pool, metrics, prefill_timeout_s)
        """The prefill legs of a disaggregated pool's turns (gateway/request/pd_hop.py)."""

    async def forward(
        self,
        rid: str,
        req: ClientRequest,
        surface: Surface,
        decision: Dispatch,
        send: Send,
        trace: RequestTrace,
        routed: Callable[[Dispatch], None],
        exchange: Exchange,
    ) -> Exchange:
        """Send ``req`` per ``decision``; one retry elsewhere (reason ``retry``) if it did not reach."""
        for attempt in range(2):
            backend = self.pool.get(req.model, decision.backend)
            exchange.backend = backend.name
            exchange.reached_backend = True  # until the attempt proves otherwise
            one = self._attempt(rid, req, surface, decision, backend, send, trace, exchange)
            if backend.limiter is None:
                end = await one
            else:  # an endpoint without signals: its latency teaches its concurrency limit
                end = await self._learning(one, req, backend, exchange)
            if end == "refused":
                exchange.reached_backend = False
            if end != "unreached":
                return exchange
            exchange.reached_backend = False
            if attempt == 0:
                retry = self.dispatcher.retry(rid, backend.name)
                if isinstance(retry, Dispatch):
                    decision = retry
                    routed(decision)
                    continue
            break
        exchange.error = GatewayError(
            502, f"Could not reach a backend for model '{req.model}'.", "upstream_unreachable"
        )
        return exchange

    async def _learning(
        self, attempt: Coroutine[Any, Any, AttemptEnd], req: ClientRequest, backend: Backend, exchange: Exchange
    ) -> AttemptEnd:
        """Await ``attempt`` (one ``_attempt``), counting the backend's requests in flight and giving
        the pool the streamed answer's time to first token (``BackendPool.observe_latency``)."""
        backend.inflight += 1
        inflight, sent = backend.inflight, time.monotonic()
        try:
            return await attempt
        finally:
            backend.inflight -= 1
            result = exchange.result
            if req.stream and exchange.status == 200 and result.first_token_at is not None:
                self.pool.observe_latency(
                    backend, result.first_token_at - sent, result.prompt_tokens, result.cached_tokens, inflight
                )

    async def _attempt(
        self,
        rid: str,
        req: ClientRequest,
        surface: Surface,
        decision: Dispatch,
        backend: Backend,
        send: Send,
        trace: RequestTrace,
        exchange: Exchange,
    ) -> AttemptEnd:
        """One attempt (see ``AttemptEnd``)."""
        # The engine's way to pin a DP rank: SGLang's body field (Target.rank), vLLM's header.
        rank, pin = backend.adapter.pin(decision.rank if backend.dp_size > 1 else None)
        call = surface.upstream(req, Target(backend.name, backend.upstream_model, rank, backend.config))
        url = backend.url + call.path
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **call.headers,
            **pin,
            "x-request-id": rid,
            **backend.headers(),
        }
        span = trace.upstream(backend.name, url, headers)  # adds traceparent
        m = self.metrics
        leg: PrefillLeg | None = None
        try:
            if self.pd.disaggregated(req.model):
                response, leg = await self.pd.send(
                    rid, req.model, req.fingerprint, rank, url, call.path, headers, call.body, trace
                )
            else:
                response = await self.client.send("POST", url, headers, call.body)
        except PrefillFailed as exc:  # no prefill partner computed it: the decode leg is closed, not blamed
            span.failed("prefill", exc)
            m.upstream_errors.labels(backend.name, "prefill").inc()
            if exc.none_healthy:
                exchange.error = GatewayError(503, str(exc), "no_healthy_backend", headers={"retry-after": "1"})
                return "refused"
            log.warning("request %s: prefill leg failed: %s", rid, exc)
            return "unreached"
        except PrefillRefused as refused:  # the prefill backend refused the request: its answer is the client's
            span.failed("prefill", refused)
            ctx = RelayContext(exchange.result, trace.first_token, 0.0, [(b"x-request-id", rid.encode())], req.client)
            exchange.result.status = exchange.status = refused.status
            await call.relay.whole(refused.status, refused.payload, refused.content_type, send, ctx)
            return "refused"
        except httpx.PoolTimeout as exc:  # our own connection budget, not the backend: refuse, blame nobody
            span.failed("connect", exc)
            exchange.error = GatewayError(
                503,
                "This gateway worker is out of upstream connections; retry shortly.",
                OVERLOADED,
                headers={"retry-after": str(self.retry_after_s)},
            )
            return "refused"
        except UpstreamMalformed as exc:  # the backend answered, in bytes that are not HTTP: no retry
            self._malformed(backend, span, exc)
            exchange.error = GatewayError(502, MALFORMED_MESSAGE, MALFORMED)
            return "failed"
        except RETRYABLE as exc:
            span.failed("connect", exc)
            m.upstream_errors.labels(backend.name, "connect").inc()
            self._blame(backend, backend_fault(exc, lagging=self.lagging()), f"{type(exc).__name__}: {exc}")
            return "unreached"
        except httpx.TimeoutException as exc:
            span.failed("timeout", exc)
            m.upstream_errors.labels(backend.name, "timeout").inc()
            self._blame(backend, backend_fault(exc, lagging=self.lagging()), "no answer in time")
            exchange.error = GatewayError(504, "The backend did not answer in time.", "upstream_timeout")
            return "failed"
        except httpx.HTTPError as exc:
            span.failed("connect", exc)
            m.upstream_errors.labels(backend.name, "connect").inc()
            self._blame(backend, backend_fault(exc, lagging=self.lagging()), f"{type(exc).__name__}: {exc}")
            exchange.error = GatewayError(502, f"Upstream error: {type(exc).__name__}.", "upstream_error")
            return "failed"
        result = exchange.result
        ctx = RelayContext(
            result, self._first_token(rid, req, trace), self.keepalive_s, [(b"x-request-id", rid.encode())], req.client
        )
        status = response.status_code
        relayed = False
        try:
            result.status = status
            if status >= 500:
                m.upstream_errors.labels(backend.name, "status_5xx").inc()
            if status != 200 or not req.stream:
                try:
                    # a short answer has usually arrived whole with its head: no waiting then
                    payload = response.body_now(BODY_LIMIT)
                    if payload is None:
                        payload = await read_body(response)
                except httpx.TimeoutException:
                    m.upstream_errors.labels(backend.name, "timeout").inc()
                    result.stream_error = "timeout"
                    exchange.error = GatewayError(504, "The backend did not answer in time.", "upstream_timeout")
                    return "failed"
                except UpstreamMalformed as exc:
                    result.stream_error = "malformed"
                    self._malformed(backend, None, exc)
                    exchange.error = GatewayError(502, MALFORMED_MESSAGE, MALFORMED)
                    return "failed"
                except httpx.HTTPError:
                    m.upstream_errors.labels(backend.name, "stream_broken").inc()
                    result.stream_error = "stream_broken"
                    exchange.error = GatewayError(502, "The backend connection broke.", "upstream_error")
                    return "failed"
                ctype = response.headers.get("content-type", "application/json").encode()
                await call.relay.whole(status, payload, ctype, send, ctx)
            else:
                exchange.status = status  # the client gets this status from the first byte on
                await call.relay.stream(response, send, ctx)
                if result.stream_error in BROKEN:
                    m.upstream_errors.labels(backend.name, result.stream_error).inc()
            exchange.status = status
            relayed = True
        finally:
            response.close()
            if leg is not None:
                leg.end(clean=relayed and status == 200 and result.stream_error is None)
            span.done(status, result.stream_error)
            fault = backend_fault(status=status)
            if fault is None and result.stream_error is not None:  # the loop's lag matters only then
                fault = stream_fault(result.stream_error, lagging=self.lagging())
            if fault:
                self.pool.request_failed(
                    backend, fault, f"answered {status}" if fault == "status_5xx" else "the response broke off"
                )
            elif result.stream_error not in BROKEN:
                self.pool.request_ok(backend)
        return "answered"

    def _malformed(self, backend: Backend, span: UpstreamSpan | None, exc: UpstreamMalformed) -> None:
        """A response llhttp rejected: a log line, the metric, the span, the backend's breaker."""
        log.warning("backend %s sent a malformed response: %s", backend.name, exc)
        self.metrics.upstream_errors.labels(backend.name, "malformed").inc()
        if span is not None:
            span.failed("malformed", exc)
        self._blame(backend, STREAM_BROKEN, str(exc))

    def _blame(self, backend: Backend, fault: str | None, detail: str) -> None:
        """Count a failed attempt against ``backend`` if it was the backend's fault (``fault``)."""
        if fault:
            self.pool.request_failed(backend, fault, detail)

    def _first_token(self, rid: str, req: ClientRequest, trace: RequestTrace) -> Callable[[], None]:
        def first_token() -> None:
            if req.stream:  # a whole answer's "first token" is its end: nothing to learn a prefill from
                self.dispatcher.first_token(rid)
            trace.first_token()

        return first_token
