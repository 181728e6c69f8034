"""The spans of one request: a SERVER span ``chat {model}`` / ``text_completion {model}`` with
GenAI semantic-convention and ``cachegate.*`` attributes, children ``cachegate.admission`` (the
wait for a dispatch decision), ``cachegate.route`` (the decision: backend, rank, reason, scores)
and one CLIENT span per upstream attempt, whose context goes upstream as W3C ``traceparent``. The
first token is the event ``first_token`` on the server span. Prompt text is recorded (as
``gen_ai.input.messages``) only with ``telemetry.record_content: true``; completion text never is
(the gateway relays the stream without assembling it). These names are what dashboards and
``docs/observability.md`` rely on.

The request's trace travels with the request's asyncio task in a context variable
(:func:`bind` / :func:`current_trace`), so code deep in the request flow reaches it without
threading it through every call. With tracing off every request gets the shared
:data:`NULL_TRACE`, whose methods do nothing. Set-up (exporter, sampler, resource):
``gateway/observability/telemetry.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PROVIDER = "sglang"
"""``gen_ai.provider.name`` (and the older ``gen_ai.system``): the engine behind the gateway."""

OPERATIONS = {"chat": "chat", "completion": "text_completion", "responses": "responses", "messages": "messages"}
PROPAGATOR = TraceContextTextMapPropagator()


def _now_ns() -> int:
    return time.time_ns()


def _error_type(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return type(exc).__name__


_STREAM_ERRORS = {
    "timeout": "upstream_timeout",
    "stream_broken": "upstream_stream_broken",
    "malformed": "upstream_malformed_response",
}
"""A broken relay's ``stream_error`` → the span's ``error.type`` (the client's error code)."""


class UpstreamSpan:
    """The CLIENT span of one upstream attempt."""

    __slots__ = ("span",)

    def __init__(self, span: Span | None) -> None:
        self.span = span

    def failed(self, kind: str, exc: BaseException | None = None) -> None:
        """The request never got a response (connect error, timeout): end the span as an error."""
        span = self.span
        if span is None:
            return
        self.span = None
        span.set_attribute("error.type", type(exc).__name__ if exc is not None else kind)
        span.set_attribute("cachegate.upstream.error", kind)
        span.set_status(Status(StatusCode.ERROR, kind))
        span.end()

    def done(self, status: int, stream_error: str | None = None) -> None:
        """The exchange is over (response closed). An exception being raised marks it failed."""
        span = self.span
        if span is None:
            return
        self.span = None
        span.set_attribute("http.response.status_code", status)
        failure = stream_error or _error_type(sys.exc_info()[1])
        if status >= 400 or failure:
            span.set_attribute("error.type", failure or str(status))
            span.set_status(Status(StatusCode.ERROR, failure or f"HTTP {status}"))
        span.end()


_NULL_UPSTREAM = UpstreamSpan(None)


class RequestTrace:
    """The spans of one request. All methods are cheap no-ops when the span is not recorded."""

    __slots__ = (
        "_admission",
        "_exemplar",
        "_failed",
        "_first_token",
        "_routed",
        "_status",
        "attempt",
        "context",
        "operation",
        "record_content",
        "recording",
        "span",
        "tracer",
    )

    def __init__(self, tracer: trace.Tracer | None, span: Span, operation: str, record_content: bool) -> None:
        self.tracer = tracer
        self.span = span
        self.operation = operation
        self.record_content = record_content
        self.recording = span.is_recording()
        self.context = trace.set_span_in_context(span)
        ctx = span.get_span_context()
        self._exemplar = {"trace_id": format(ctx.trace_id, "032x")} if ctx.trace_flags.sampled else None
        self._admission: Span | None = None
        self._failed = False
        self._first_token = False
        self._status = 0
        self.attempt = 0
        self._routed: dict[str, Any] = {}

    # ---- the request ----------------------------------------------------------------------
    def exemplar(self) -> dict[str, str] | None:
        """``{"trace_id": ...}`` for a histogram exemplar, only when this trace is sampled."""
        return self._exemplar

    def request(self, rid: str, team: str, req: Any) -> None:
        """The parsed request (a ``ParsedRequest``): name the span and record the request attributes."""
        self.span.update_name(f"{self.operation} {req.model}")
        if not self.recording:
            return
        body = req.body
        attrs: dict[str, Any] = {
            "gen_ai.request.model": req.model,
            "gen_ai.request.stream": req.stream,
            "cachegate.team": team,
            "cachegate.request_id": rid,
        }
        if req.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = req.max_tokens
        for field, attr in (
            ("temperature", "gen_ai.request.temperature"),
            ("top_p", "gen_ai.request.top_p"),
            ("seed", "gen_ai.request.seed"),
        ):
            value = body.get(field)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attrs[attr] = value
        if isinstance(body.get("n"), int) and body["n"] != 1:
            attrs["gen_ai.request.choice.count"] = body["n"]
        if self.record_content:
            content = body.get("messages") if "messages" in body else body.get("prompt")
            attrs["gen_ai.input.messages"] = orjson.dumps(content).decode()
        self.span.set_attributes(attrs)

    def facts(self, prompt_tokens: int) -> None:
        if self.recording:
            self.span.set_attribute("cachegate.prompt.estimated_tokens", prompt_tokens)

    # ---- admission and routing ------------------------------------------------------------
    def admission_started(self) -> None:
        if self.recording and self.tracer is not None:
            self._admission = self.tracer.start_span("cachegate.admission", context=self.context)

    def admission_done(self, wait_s: float, refusal: Any = None) -> None:
        """The wait is over: dispatched, refused (``refusal``: a ``Refuse``), or, when a
        ``CancelledError`` is propagating, abandoned by the client."""
        if not self.recording:
            return
        self.span.set_attribute("cachegate.queue_wait_s", wait_s)
        span = self._admission
        if span is None:
            return
        exc = sys.exc_info()[1]
        span.set_attribute("cachegate.queue_wait_s", wait_s)
        if refusal is None and exc is not None and hasattr(exc, "refusal"):
            refusal = exc.refusal
        if refusal is not None:
            outcome = "refused"
            span.set_attribute("cachegate.refusal.code", refusal.code)
            self.span.set_attribute("cachegate.refusal.code", refusal.code)
        elif exc is not None:
            outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "error"
        else:
            outcome = "dispatched"
        span.set_attribute("cachegate.admission.outcome", outcome)
        self.span.set_attribute("cachegate.admission.outcome", outcome)
        self._admission = None
        span.end()

    def routed(self, decision: Any) -> None:
        """A dispatch decision (``Dispatch``; again on a retry): the ``cachegate.route`` span."""
        self.attempt += 1
        if not self.recording or self.tracer is None:
            return
        attrs: dict[str, Any] = {
            "cachegate.backend": decision.backend,
            "cachegate.route.reason": decision.reason,
            "cachegate.route.attempt": self.attempt,
        }
        if decision.rank is not None:
            attrs["cachegate.rank"] = decision.rank
        for key, value in decision.scores.items():
            attrs[f"cachegate.route.score.{key}"] = value
        matched = decision.scores.get("matched_tokens")
        if matched is not None:
            attrs["cachegate.prefix.matched_tokens"] = int(matched)
        now = _now_ns()
        self.tracer.start_span("cachegate.route", context=self.context, start_time=now, attributes=attrs).end(
            end_time=now
        )
        # Set at the end: a retry's decision replaces the first's (a span cannot unset an attribute).
        self._routed = {k: v for k, v in attrs.items() if not k.startswith("cachegate.route.score.")}

    # ---- the upstream hop -----------------------------------------------------------------
    def upstream(self, backend: str, url: str, headers: dict[str, str]) -> UpstreamSpan:
        """Open the CLIENT span of one attempt and put its ``traceparent`` into ``headers``."""
        if self.tracer is None:
            return _NULL_UPSTREAM
        host, _, rest = url.partition("://")[2].partition("/")
        address, _, port = host.rpartition(":") if ":" in host else (host, "", "")
        attrs: dict[str, Any] = {
            "http.request.method": "POST",
            "url.full": url,
            "server.address": address,
            "url.template": "/" + rest,
            "cachegate.backend": backend,
            "cachegate.route.attempt": self.attempt,
        }
        if port.isdigit():
            attrs["server.port"] = int(port)
        span = self.tracer.start_span(f"POST /{rest}", context=self.context, kind=SpanKind.CLIENT, attributes=attrs)
        PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        return UpstreamSpan(span)

    def first_token(self) -> None:
        if self.recording and not self._first_token:
            self._first_token = True
            self.span.add_event("first_token")

    # ---- the answer -----------------------------------------------------------------------
    def failed(self, status: int, code: str | None) -> None:
        """The gateway answered with an error of its own (400s, 404, 413, refusals, 502/504)."""
        self._status = status
        self._failed = True
        if not self.recording:
            return
        self.span.set_attribute("http.response.status_code", status)
        self.span.set_attribute("error.type", code or str(status))
        self.span.set_status(Status(StatusCode.ERROR, code or f"HTTP {status}"))

    def finished(self, status: int, result: Any, backend: str = "") -> None:
        """The upstream exchange is over (``result``: a proxy ``Result``)."""
        self._status = status
        if not self.recording:
            return
        attrs: dict[str, Any] = {"http.response.status_code": status}
        if result.response_model:
            attrs["gen_ai.response.model"] = result.response_model
        if result.finish_reasons:
            attrs["gen_ai.response.finish_reasons"] = list(result.finish_reasons)
        if result.usage:
            attrs["gen_ai.usage.input_tokens"] = result.prompt_tokens
            attrs["gen_ai.usage.output_tokens"] = result.completion_tokens
            attrs["gen_ai.usage.cache_read.input_tokens"] = result.cached_tokens
            attrs["cachegate.cached_tokens"] = result.cached_tokens
        if result.first_token_at is not None:
            attrs["cachegate.output_chunks"] = result.output_chunks
        self.span.set_attributes(attrs)
        if (status >= 400 or result.stream_error) and not self._failed:
            kind = _STREAM_ERRORS.get(result.stream_error or "")
            error = kind or ("upstream_stream_error" if result.stream_error else str(status))
            self.span.set_attribute("error.type", error)
            self.span.set_status(Status(StatusCode.ERROR, error))

    def end(self, client_left: bool = False) -> None:
        """Close the server span (and an admission span a cancelled wait left open)."""
        if self._admission is not None:
            self._admission.set_attribute("cachegate.admission.outcome", "cancelled")
            self._admission.end()
            self._admission = None
        if not self.recording:
            self.span.end()
            return
        if self._routed:
            self.span.set_attributes(self._routed)
        if client_left:
            self.span.set_attribute("cachegate.client_disconnected", True)
            self.span.set_attribute("error.type", "client_disconnected")
            if not self._status:
                self.span.set_attribute("http.response.status_code", 499)
            self.span.set_status(Status(StatusCode.ERROR, "client disconnected"))
        self.span.end()


class _NullTrace(RequestTrace):
    """Tracing off: every method returns at once."""

    __slots__ = ()

    def __init__(self) -> None:
        self.recording = False
        self._exemplar = None
        self.attempt = 0

    def request(self, rid: str, team: str, req: Any) -> None:
        return None

    def facts(self, prompt_tokens: int) -> None:
        return None

    def admission_started(self) -> None:
        return None

    def admission_done(self, wait_s: float, refusal: Any = None) -> None:
        return None

    def routed(self, decision: Any) -> None:
        return None

    def upstream(self, backend: str, url: str, headers: dict[str, str]) -> UpstreamSpan:
        return _NULL_UPSTREAM

    def first_token(self) -> None:
        return None

    def failed(self, status: int, code: str | None) -> None:
        return None

    def finished(self, status: int, result: Any, backend: str = "") -> None:
        return None

    def end(self, client_left: bool = False) -> None:
        return None


NULL_TRACE: RequestTrace = _NullTrace()

_CURRENT: contextvars.ContextVar[RequestTrace] = contextvars.ContextVar("cachegate_trace", default=NULL_TRACE)


def bind(request_trace: RequestTrace) -> contextvars.Token[RequestTrace]:
    """Make ``request_trace`` the current request's trace (inherited by tasks created after)."""
    return _CURRENT.set(request_trace)


def current_trace() -> RequestTrace:
    return _CURRENT.get()
