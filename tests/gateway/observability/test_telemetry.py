"""Traces end to end: gateway process → OTLP/HTTP → a real receiver in this test that decodes the
protobuf; requests go through a simulated SGLang twin. Plus fast unit tests of the set-up."""

from __future__ import annotations

import contextlib
import gzip
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backends.sim.server import DEFAULT_MODEL
from backends.sim.testing import run_twin
from gateway.config.schema import TelemetryConfig
from gateway.observability.telemetry import NULL_TRACE, Telemetry, traces_url
from tests.harness import run_gateway

KIND_SERVER, KIND_CLIENT, KIND_INTERNAL = 2, 3, 1
STATUS_ERROR = 2
SECRET = "zebra-violet-7731"  # a prompt marker that must never reach an exported attribute


# ---- the receiver ------------------------------------------------------------------------------------


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


class OtlpReceiver:
    """A minimal OTLP/HTTP traces receiver: ``POST /v1/traces`` with an ``ExportTraceServiceRequest``."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.posts = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.accept(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def accept(self, request: ExportTraceServiceRequest) -> None:
        decoded = []
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    decoded.append(
                        {
                            "name": s.name,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(),
                            "kind": s.kind,
                            "resource": resource,
                            "attrs": {kv.key: _value(kv.value) for kv in s.attributes},
                            "events": [
                                (e.name, {kv.key: _value(kv.value) for kv in e.attributes}, e.time_unix_nano)
                                for e in s.events
                            ],
                            "status": s.status.code,
                            "status_message": s.status.message,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                        }
                    )
        with self.lock:
            self.posts += 1
            self.spans.extend(decoded)

    def wait(self, predicate: Callable[[list[dict[str, Any]]], Any], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                found = predicate(list(self.spans))
            if found:
                return found
            if time.monotonic() > deadline:
                names = sorted({s["name"] for s in self.spans})
                raise TimeoutError(f"no matching spans after {timeout}s; received {names}")
            time.sleep(0.02)

    def trace_of(self, rid: str, children: int = 3, timeout: float = 10.0) -> tuple[dict[str, Any], list]:
        """The server span with ``cachegate.request_id == rid`` and the spans of its trace, once the
        server span and at least ``children`` children have arrived."""

        def find(spans: list[dict[str, Any]]) -> tuple[dict[str, Any], list] | None:
            server = next((s for s in spans if s["attrs"].get("cachegate.request_id") == rid), None)
            if server is None:
                return None
            mine = [s for s in spans if s["trace_id"] == server["trace_id"] and s is not server]
            return (server, mine) if len([s for s in mine if s["parent"] == server["span_id"]]) >= children else None

        return self.wait(find, timeout)

    @contextlib.contextmanager
    def running(self) -> Iterator[OtlpReceiver]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(5)


# ---- fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver().running() as r:
        yield r


@pytest.fixture(scope="module")
def twin() -> Iterator[str]:
    with run_twin("tiny", time_scale=0.02, abort_delay_s=0.2) as url:
        yield url


@pytest.fixture(scope="module")
def gateway(receiver: OtlpReceiver, twin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = tmp_path_factory.mktemp("tel") / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "models": {"kimi": {"upstream_model": DEFAULT_MODEL, "backends": [{"url": twin, "name": "twin-a"}]}},
                "health": {"interval_s": 0.2, "load_interval_s": 0.2},
                "telemetry": {"otlp_endpoint": None, "service_name": "cachegate-test", "sample_ratio": 1.0},
            }
        )
    )
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    with run_gateway("--config", str(path), env=env) as base:
        yield base


def _chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "kimi", "messages": [{"role": "user", "content": prompt}], "max_tokens": 12, **extra}


def _stream(base: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[str, bytes]:
    with httpx.stream(
        "POST", base + "/v1/chat/completions", json={**body, "stream": True}, headers=headers or {}, timeout=30
    ) as r:
        assert r.status_code == 200, r.read()
        return r.headers["x-request-id"], b"".join(r.iter_raw())


# ---- end to end --------------------------------------------------------------------------------------


def test_streamed_request_span_tree(gateway: str, receiver: OtlpReceiver, twin: str) -> None:
    rid, data = _stream(gateway, _chat(f"Tell me about {SECRET} please."))
    assert data.endswith(b"data: [DONE]\n\n")
    server, spans = receiver.trace_of(rid)

    assert server["name"] == "chat kimi" and server["kind"] == KIND_SERVER
    assert server["parent"] == "", "no client traceparent: the server span is the root"
    assert server["resource"]["service.name"] == "cachegate-test"
    assert server["resource"]["deployment.environment"] == "test"
    a = server["attrs"]
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == "sglang"
    assert a["gen_ai.request.model"] == "kimi"
    assert a["gen_ai.response.model"] == DEFAULT_MODEL
    assert a["gen_ai.request.max_tokens"] == 12 and a["gen_ai.request.stream"] is True
    assert a["gen_ai.usage.output_tokens"] == 12
    assert a["gen_ai.usage.input_tokens"] > 5
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["cachegate.cached_tokens"] == a["gen_ai.usage.cache_read.input_tokens"] >= 0
    assert a["cachegate.team"] == "default" and a["cachegate.backend"] == "twin-a"
    assert a["cachegate.admission.outcome"] == "dispatched" and a["cachegate.queue_wait_s"] >= 0
    assert a["cachegate.route.reason"] in ("prefix", "cold_hash", "least_wait", "imbalance", "retry")
    assert a["cachegate.prompt.estimated_tokens"] > 0
    assert a["http.response.status_code"] == 200
    assert server["status"] != STATUS_ERROR, (server["status_message"], a)

    by_name = {s["name"]: s for s in spans}
    admission, route = by_name["cachegate.admission"], by_name["cachegate.route"]
    upstream = next(s for s in spans if s["kind"] == KIND_CLIENT)
    for child in (admission, route, upstream):
        assert child["parent"] == server["span_id"] and child["trace_id"] == server["trace_id"]
    assert admission["kind"] == route["kind"] == KIND_INTERNAL
    assert admission["attrs"]["cachegate.admission.outcome"] == "dispatched"
    assert route["attrs"]["cachegate.backend"] == "twin-a"
    assert route["attrs"]["cachegate.route.reason"] == a["cachegate.route.reason"]
    assert upstream["name"] == "POST /v1/chat/completions"
    assert upstream["attrs"]["http.request.method"] == "POST"
    assert upstream["attrs"]["url.full"] == twin + "/v1/chat/completions"
    assert upstream["attrs"]["server.address"] == "127.0.0.1"
    assert upstream["attrs"]["http.response.status_code"] == 200
    # Order: wait, then route, then the upstream call, all inside the server span.
    assert server["start"] <= admission["start"] <= admission["end"] <= route["start"] <= upstream["start"]
    assert upstream["end"] <= server["end"]

    events = [e for e in server["events"] if e[0] == "first_token"]
    assert len(events) == 1 and upstream["start"] < events[0][2] < server["end"]

    seen = httpx.get(twin + "/_twin/last_traceparent").json()["traceparent"]
    version, trace_id, parent_id, flags = seen.split("-")
    assert (version, trace_id) == ("00", server["trace_id"]) and int(flags, 16) & 1, "same trace, sampled"
    assert parent_id == upstream["span_id"], "the upstream sees the client span as its parent"

    for span in [server, *spans]:
        for value in [*span["attrs"].values(), *(v for e in span["events"] for v in e[1].values())]:
            assert SECRET not in str(value), f"prompt text leaked into {span['name']}"


def test_client_traceparent_becomes_parent(gateway: str, receiver: OtlpReceiver, twin: str) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    rid, _ = _stream(gateway, _chat("hello there"), {"traceparent": f"00-{trace_id}-{parent}-01"})
    server, _ = receiver.trace_of(rid)
    assert server["trace_id"] == trace_id and server["parent"] == parent
    assert httpx.get(twin + "/_twin/last_traceparent").json()["traceparent"].split("-")[1] == trace_id


def test_errors_set_span_status(gateway: str, receiver: OtlpReceiver) -> None:
    r = httpx.post(gateway + "/v1/chat/completions", json={**_chat("x"), "model": "nope"})
    assert r.status_code == 404
    missing = receiver.wait(lambda spans: [s for s in spans if s["attrs"].get("error.type") == "model_not_found"])
    assert missing[0]["status"] == STATUS_ERROR and missing[0]["attrs"]["http.response.status_code"] == 404

    # Past Kimi's context window (262,144): the gateway refuses it at once (it knows the window), no upstream.
    r = httpx.post(gateway + "/v1/chat/completions", json=_chat("x", max_tokens=300_000), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    server, spans = receiver.trace_of(r.headers["x-request-id"], children=1)  # admission only: no upstream hop
    assert server["status"] == STATUS_ERROR and server["attrs"]["http.response.status_code"] == 400
    assert server["attrs"]["error.type"] == "context_length_exceeded"
    assert not [s for s in spans if s["kind"] == KIND_CLIENT]

    # Two prompts in one completion request: the engine itself (the twin) refuses it (a 400 from upstream).
    r = httpx.post(
        gateway + "/v1/completions", json={"model": "kimi", "prompt": ["a", "b"], "max_tokens": 4}, timeout=30
    )
    assert r.status_code == 400
    server, spans = receiver.trace_of(r.headers["x-request-id"])
    assert server["status"] == STATUS_ERROR and server["attrs"]["http.response.status_code"] == 400
    upstream = next(s for s in spans if s["kind"] == KIND_CLIENT)
    assert upstream["status"] == STATUS_ERROR and upstream["attrs"]["http.response.status_code"] == 400


def test_client_disconnect_sets_error(gateway: str, receiver: OtlpReceiver) -> None:
    body = {**_chat("a long answer please"), "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=body, timeout=30) as r:
        rid = r.headers["x-request-id"]
        next(r.iter_raw())  # the first bytes, then hang up mid-stream
    server, _ = receiver.trace_of(rid)
    assert server["status"] == STATUS_ERROR
    assert server["attrs"]["cachegate.client_disconnected"] is True


# ---- unit: set-up ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts without ``OTEL_*`` variables (the SDK reads the process environment)."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


def _exporter_url(tel: Telemetry) -> str:
    return str(tel.exporter._endpoint)  # type: ignore[attr-defined]


def test_config_env_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    off = TelemetryConfig()
    assert not Telemetry(off).enabled
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not Telemetry(off).enabled
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not Telemetry(off).enabled
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    # The SDK's own handling: endpoint, service name, sampler from the environment.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gw")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    tel = Telemetry(off)
    assert tel.enabled and tel.provider is not None
    assert _exporter_url(tel) == "http://c:4318/v1/traces"
    assert tel.provider.resource.attributes["service.name"] == "gw"
    assert "TraceIdRatioBased{0.25}" in tel.provider.sampler.get_description()
    tel.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/custom")
    tel = Telemetry(off)
    assert _exporter_url(tel) == "http://t:1/custom"
    tel.shutdown()
    # The config's endpoint wins over every OTEL_* variable.
    cfg = TelemetryConfig(
        otlp_endpoint="collector:4318", otlp_headers={"x-token": "t"}, sample_ratio=0.5, service_name="cg"
    )
    tel = Telemetry(cfg)
    assert tel.provider is not None and _exporter_url(tel) == "http://collector:4318/v1/traces"
    assert tel.provider.resource.attributes["service.name"] == "cg"
    assert "TraceIdRatioBased{0.5}" in tel.provider.sampler.get_description()
    tel.shutdown()
    assert traces_url("https://h/v1/traces") == "https://h/v1/traces"


def test_off_is_the_shared_null_trace() -> None:
    tel = Telemetry(TelemetryConfig())
    assert not tel.enabled
    t = tel.begin("chat", {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    assert t is NULL_TRACE and t.exemplar() is None
    headers: dict[str, str] = {}
    t.upstream("b", "http://h:1/v1/chat/completions", headers).done(200)
    assert headers == {}


def test_sampling_ratio_zero_exports_nothing_and_no_exemplar() -> None:
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(sample_ratio=0.0), exporter=exporter)
    t = tel.begin("chat", {})
    assert t.exemplar() is None and not t.recording
    headers: dict[str, str] = {}
    t.upstream("b", "http://h:1/v1/chat/completions", headers).done(200)
    assert int(headers["traceparent"][-2:], 16) & 1 == 0, "not sampled, still propagated"
    t.end()
    tel.shutdown()
    assert exporter.get_finished_spans() == ()


def test_sampled_parent_is_honoured_and_exemplar_has_trace_id() -> None:
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetryConfig(sample_ratio=0.0), exporter=exporter)
    t = tel.begin("completion", {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    assert t.exemplar() == {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    t.admission_started()
    t.end(client_left=True)  # a wait the client abandoned
    tel.shutdown()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["text_completion"].kind == SpanKind.SERVER
    assert spans["text_completion"].status.status_code == StatusCode.ERROR
    assert spans["cachegate.admission"].attributes["cachegate.admission.outcome"] == "cancelled"


def test_record_content_only_when_enabled() -> None:
    from gateway.surfaces.openai import parse

    req = parse(b'{"model": "m", "messages": [{"role": "user", "content": "' + SECRET.encode() + b'"}]}', "chat")
    for record, expect in ((False, False), (True, True)):
        exporter = InMemorySpanExporter()
        tel = Telemetry(TelemetryConfig(record_content=record), exporter=exporter)
        t = tel.begin("chat", {})
        t.request("rid", "team", req)
        t.end()
        tel.shutdown()
        (span,) = exporter.get_finished_spans()
        assert span.name == "chat m"
        assert any(SECRET in str(v) for v in span.attributes.values()) is expect
