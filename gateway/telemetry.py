"""Tracing: OpenTelemetry set-up and the spans of one request.

Export is OTLP over HTTP/protobuf through a ``BatchSpanProcessor``: spans are queued in memory and
sent from a background thread, so a slow or dead collector never delays a request (a full queue
drops spans). Where spans go:

- ``telemetry.otlp_endpoint`` set in the config: that collector (a base URL such as
  ``http://collector:4318``, ``/v1/traces`` appended unless given), with ``otlp_headers``,
  ``service_name`` and ``sample_ratio`` from the config;
- otherwise the standard variables: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
  ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP[_TRACES]_HEADERS``, ``OTEL_SERVICE_NAME``,
  ``OTEL_TRACES_SAMPLER[_ARG]`` (ratio samplers and ``always_on``/``always_off``);
- neither: tracing is off and every request gets the shared :data:`NULL_TRACE`, whose methods do
  nothing (no span objects, no ids, no header parsing). ``OTEL_SDK_DISABLED=true`` or
  ``OTEL_TRACES_EXPORTER=none`` also turn it off.

Sampling is ``ParentBased(TraceIdRatioBased(ratio))``: a client's sampled ``traceparent`` is
honoured, otherwise ``ratio`` of the traces are kept. ``OTEL_BSP_*`` tune the batch processor and
``OTEL_RESOURCE_ATTRIBUTES`` adds resource attributes.

One request (interfaces §4): a SERVER span ``chat {model}`` / ``text_completion {model}`` with
GenAI semantic-convention and ``cachegate.*`` attributes, children ``cachegate.admission`` (the
wait for a dispatch decision), ``cachegate.route`` (the decision: backend, rank, reason, scores)
and one CLIENT span per upstream attempt, whose context goes upstream as W3C ``traceparent``. The
first token is the event ``first_token`` on the server span. Prompt text is recorded (as
``gen_ai.input.messages``) only with ``telemetry.record_content: true``; completion text never is
(the gateway relays the stream without assembling it).

The request's trace travels with the request's asyncio task in a context variable
(:func:`bind` / :func:`current_trace`), so code deep in the request flow reaches it without
threading it through every call.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.config import TelemetryConfig

log = logging.getLogger("cachegate")

PROVIDER = "sglang"
"""``gen_ai.provider.name`` (and the older ``gen_ai.system``): the engine behind the gateway."""

OPERATIONS = {"chat": "chat", "completion": "text_completion", "responses": "responses", "messages": "messages"}
_PROPAGATOR = TraceContextTextMapPropagator()


class Settings:
    """Where and how to export, resolved from the config and the environment."""

    __slots__ = ("endpoint", "headers", "ratio", "service_name")

    def __init__(self, endpoint: str, headers: Mapping[str, str] | None, service_name: str, ratio: float) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.service_name = service_name
        self.ratio = ratio

    def __repr__(self) -> str:  # headers may hold credentials: never print them
        return f"Settings(endpoint={self.endpoint!r}, service_name={self.service_name!r}, ratio={self.ratio})"


def traces_url(endpoint: str) -> str:
    """A collector base URL (or ``host:port``) → its OTLP/HTTP traces URL."""
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def _env_ratio(env: Mapping[str, str], default: float) -> float:
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler in ("always_on", "parentbased_always_on"):
        return 1.0
    if sampler in ("always_off", "parentbased_always_off"):
        return 0.0
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        try:
            return min(1.0, max(0.0, float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))))
        except ValueError:
            log.warning("OTEL_TRACES_SAMPLER_ARG is not a number; sampling every trace")
            return 1.0
    return default


def resolve(config: TelemetryConfig, env: Mapping[str, str] | None = None) -> Settings | None:
    """The export settings, or None when tracing is off."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if config.otlp_endpoint:
        return Settings(traces_url(config.otlp_endpoint), dict(config.otlp_headers) or None, config.service_name,
                        config.sample_ratio)
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or ""
    if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = traces_url(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    if not endpoint:
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    if protocol and protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: cachegate exports OTLP over http/protobuf only", protocol)
    # headers=None: the exporter reads OTEL_EXPORTER_OTLP[_TRACES]_HEADERS itself.
    return Settings(endpoint, None, env.get("OTEL_SERVICE_NAME") or config.service_name,
                    _env_ratio(env, config.sample_ratio))


class Telemetry:
    """One worker's tracer. ``exporter`` replaces the OTLP exporter (tests)."""

    def __init__(self, config: TelemetryConfig, env: Mapping[str, str] | None = None,
                 exporter: SpanExporter | None = None) -> None:
        self.record_content = config.record_content
        self.settings = resolve(config, env)
        if self.settings is None and exporter is not None:
            self.settings = Settings("", None, config.service_name, config.sample_ratio)
        self.provider: TracerProvider | None = None
        self.tracer: trace.Tracer | None = None
        if self.settings is None:
            return
        s = self.settings
        resource = Resource.create({"service.name": s.service_name, "service.version": _version()})
        self.provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(s.ratio)), resource=resource,
                                       shutdown_on_exit=False)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=s.endpoint, headers=s.headers)))
        self.tracer = self.provider.get_tracer("cachegate", _version())
        log.info("tracing on: %r", s)

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def begin(self, kind: str, headers: Mapping[str, str], start_ns: int | None = None) -> RequestTrace:
        """Open the server span of one request (a child of the client's ``traceparent`` if any)."""
        if self.tracer is None:
            return NULL_TRACE
        parent: Context | None = None
        if "traceparent" in headers:
            parent = _PROPAGATOR.extract({k: headers[k] for k in ("traceparent", "tracestate") if k in headers})
        operation = OPERATIONS.get(kind, kind)
        span = self.tracer.start_span(operation, context=parent, kind=SpanKind.SERVER, start_time=start_ns,
                                      attributes={"gen_ai.operation.name": operation,
                                                  "gen_ai.provider.name": PROVIDER, "gen_ai.system": PROVIDER,
                                                  "http.request.method": "POST"})
        return RequestTrace(self.tracer, span, operation, self.record_content)

    def shutdown(self) -> None:
        """Flush what is queued and stop the export thread."""
        if self.provider is not None:
            self.provider.shutdown()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("cachegate")
    except Exception:  # not installed: running from a checkout
        return "0"


def _now_ns() -> int:
    return time.time_ns()


def _error_type(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return type(exc).__name__


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

    __slots__ = ("_admission", "_exemplar", "_failed", "_first_token", "_status", "attempt",
                 "context", "operation", "record_content", "recording", "span", "tracer")

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
        attrs: dict[str, Any] = {"gen_ai.request.model": req.model, "gen_ai.request.stream": req.stream,
                                 "cachegate.team": team, "cachegate.request_id": rid}
        if req.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = req.max_tokens
        for field, attr in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p"),
                            ("seed", "gen_ai.request.seed")):
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
        attrs: dict[str, Any] = {"cachegate.backend": decision.backend, "cachegate.route.reason": decision.reason,
                                 "cachegate.route.attempt": self.attempt}
        if decision.rank is not None:
            attrs["cachegate.rank"] = decision.rank
        for key, value in decision.scores.items():
            attrs[f"cachegate.route.score.{key}"] = value
        matched = decision.scores.get("matched_tokens")
        if matched is not None:
            attrs["cachegate.prefix.matched_tokens"] = int(matched)
        now = _now_ns()
        self.tracer.start_span("cachegate.route", context=self.context, start_time=now,
                               attributes=attrs).end(end_time=now)
        self.span.set_attributes({k: v for k, v in attrs.items() if not k.startswith("cachegate.route.score.")})

    # ---- the upstream hop -----------------------------------------------------------------
    def upstream(self, backend: str, url: str, headers: dict[str, str]) -> UpstreamSpan:
        """Open the CLIENT span of one attempt and put its ``traceparent`` into ``headers``."""
        if self.tracer is None:
            return _NULL_UPSTREAM
        host, _, rest = url.partition("://")[2].partition("/")
        address, _, port = host.rpartition(":") if ":" in host else (host, "", "")
        attrs: dict[str, Any] = {"http.request.method": "POST", "url.full": url, "server.address": address,
                                 "url.template": "/" + rest, "cachegate.backend": backend,
                                 "cachegate.route.attempt": self.attempt}
        if port.isdigit():
            attrs["server.port"] = int(port)
        span = self.tracer.start_span(f"POST /{rest}", context=self.context, kind=SpanKind.CLIENT,
                                      attributes=attrs)
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
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
            kind = result.stream_error if result.stream_error in ("timeout", "stream_broken") else None
            error = f"upstream_{kind}" if kind else ("upstream_stream_error" if result.stream_error
                                                       else str(status))
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
