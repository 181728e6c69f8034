"""Tracing set-up: the OpenTelemetry tracer of one worker. The spans of a request: ``gateway/observability/spans.py``.

Export is OTLP over HTTP/protobuf through a ``BatchSpanProcessor``: spans are queued in memory and
sent from a background thread, so a slow or dead collector never delays a request (a full queue
drops spans). Where spans go:

- ``telemetry.otlp_endpoint`` set in the config: that collector (a base URL such as
  ``http://collector:4318``, ``/v1/traces`` appended unless given), with ``otlp_headers``,
  ``service_name`` and ``sample_ratio`` from the config; the ``OTEL_*`` variables do not override them;
- otherwise the OpenTelemetry SDK's own environment handling: tracing is on when
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, and the SDK reads
  those, ``OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`` (and the exporter's other variables),
  ``OTEL_SERVICE_NAME`` (else the config's ``service_name``), ``OTEL_RESOURCE_ATTRIBUTES`` and
  ``OTEL_TRACES_SAMPLER[_ARG]`` (else the config's ``sample_ratio``);
- neither, ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``: tracing is off and every request
  gets the shared :data:`NULL_TRACE` (no span objects, no ids, no header parsing).

Sampling (unless ``OTEL_TRACES_SAMPLER`` says otherwise) is ``ParentBased(TraceIdRatioBased(ratio))``:
a client's sampled ``traceparent`` is honoured, otherwise ``ratio`` of the traces are kept.
``OTEL_BSP_*`` tune the batch processor (the SDK reads them too).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from gateway.config.schema import TelemetryConfig
from gateway.observability.spans import NULL_TRACE as NULL_TRACE
from gateway.observability.spans import OPERATIONS, PROPAGATOR, PROVIDER
from gateway.observability.spans import RequestTrace as RequestTrace
from gateway.observability.spans import bind as bind
from gateway.observability.spans import current_trace as current_trace

log = logging.getLogger("cachegate")


def traces_url(endpoint: str) -> str:
    """A collector base URL (or ``host:port``) → its OTLP/HTTP traces URL."""
    if "://" not in endpoint:
        endpoint = "http://" + endpoint
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def _env_says_export() -> bool:
    """Whether the ``OTEL_*`` variables ask for an export at all (the SDK reads the details)."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


class Telemetry:
    """One worker's tracer. ``exporter`` replaces the OTLP exporter (tests)."""

    def __init__(self, config: TelemetryConfig, exporter: SpanExporter | None = None) -> None:
        self.record_content = config.record_content
        self.provider: TracerProvider | None = None
        self.tracer: trace.Tracer | None = None
        self.exporter: SpanExporter | None = None
        disabled = os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        from_config = bool(config.otlp_endpoint) and not disabled
        if not (from_config or exporter is not None or _env_says_export()):
            return
        resource = Resource.create({"service.name": config.service_name, "service.version": _version()})
        sampler: Sampler | None = ParentBased(TraceIdRatioBased(config.sample_ratio))
        if not from_config:
            resource = resource.merge(OTELResourceDetector().detect())  # OTEL_SERVICE_NAME wins over the config
            if os.environ.get("OTEL_TRACES_SAMPLER"):
                sampler = None  # the SDK builds it from OTEL_TRACES_SAMPLER[_ARG]
        if exporter is None:
            exporter = (
                OTLPSpanExporter(
                    endpoint=traces_url(config.otlp_endpoint or ""), headers=dict(config.otlp_headers) or None
                )
                if from_config
                else OTLPSpanExporter()
            )
        self.exporter = exporter
        self.provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("cachegate", _version())
        where = traces_url(config.otlp_endpoint or "") if from_config else "the OTEL_EXPORTER_OTLP_* endpoint"
        log.info(
            "tracing on: %s, service %s, %s",
            where,
            resource.attributes.get("service.name"),
            self.provider.sampler.get_description(),
        )

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def begin(self, kind: str, headers: Mapping[str, str], start_ns: int | None = None) -> RequestTrace:
        """Open the server span of one request (a child of the client's ``traceparent`` if any)."""
        if self.tracer is None:
            return NULL_TRACE
        parent: Context | None = None
        if "traceparent" in headers:
            parent = PROPAGATOR.extract({k: headers[k] for k in ("traceparent", "tracestate") if k in headers})
        operation = OPERATIONS.get(kind, kind)
        span = self.tracer.start_span(
            operation,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=start_ns,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.system": PROVIDER,
                "http.request.method": "POST",
            },
        )
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
