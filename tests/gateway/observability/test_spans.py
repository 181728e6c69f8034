"""The spans of one request (gateway/observability/spans.py), recorded by the OpenTelemetry SDK into
memory: the server span's name and attributes, the admission, route and upstream spans under it, the
``traceparent`` sent upstream, the error statuses, and the trace bound to the request's task.
Set-up (exporter, sampler, ``OTEL_*``) and the spans of a served request end to end:
tests/gateway/observability/test_telemetry.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from gateway.observability.spans import NULL_TRACE, RequestTrace, UpstreamSpan, bind, current_trace
from gateway.relay.proxy import Result
from gateway.surfaces.openai import parse
from policies.types import Dispatch, Refuse

URL = "http://10.0.0.7:30000/v1/chat/completions"


class Recorder:
    """A tracer whose finished spans are kept in memory."""

    def __init__(self, sampled: bool = True) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(**({} if sampled else {"sampler": ALWAYS_OFF}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def begin(self, operation: str = "chat", record_content: bool = False) -> RequestTrace:
        span = self.tracer.start_span(operation, kind=SpanKind.SERVER)
        return RequestTrace(self.tracer, span, operation, record_content)

    def spans(self) -> dict[str, ReadableSpan]:
        return {s.name: s for s in self.exporter.get_finished_spans()}


@pytest.fixture()
def rec() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.provider.shutdown()


CHAT = (
    b'{"model": "kimi", "stream": true, "max_tokens": 64, "temperature": 0.2, "top_p": true, "seed": 7, "n": 2,'
    b' "messages": [{"role": "user", "content": "the secret word"}]}'
)


def test_the_request_names_the_span_and_sets_the_request_attributes(rec: Recorder) -> None:
    t = rec.begin()
    t.request("cg-1", "platform", parse(CHAT, "chat"))
    t.facts(321)
    t.end()
    span = rec.spans()["chat kimi"]
    assert span.kind == SpanKind.SERVER
    assert dict(span.attributes or {}) == {
        "gen_ai.request.model": "kimi",
        "gen_ai.request.stream": True,
        "cachegate.team": "platform",
        "cachegate.request_id": "cg-1",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.seed": 7,  # top_p: true is no number: left out
        "gen_ai.request.choice.count": 2,
        "cachegate.prompt.estimated_tokens": 321,
    }
    assert span.status.status_code == StatusCode.UNSET


def test_prompt_text_is_recorded_only_when_asked(rec: Recorder) -> None:
    quiet, loud = rec.begin(), rec.begin("text_completion", record_content=True)
    quiet.request("a", "t", parse(CHAT, "chat"))
    loud.request("b", "t", parse(b'{"model": "kimi", "prompt": "the secret word"}', "completion"))
    quiet.end()
    loud.end()
    spans = rec.spans()
    assert not any("secret" in str(v) for v in (spans["chat kimi"].attributes or {}).values())
    assert (spans["text_completion kimi"].attributes or {})["gen_ai.input.messages"] == '"the secret word"'


def test_each_route_decision_is_a_span_and_its_choice_lands_on_the_request(rec: Recorder) -> None:
    t = rec.begin()
    t.routed(Dispatch("r", "b1", 3, "prefix", {"matched_tokens": 512.0, "wait_s": 0.25}))
    t.routed(Dispatch("r", "b2", None, "retry", {}))  # the retry's decision
    t.end()
    server = rec.spans()["chat"]
    routes = [s for s in rec.exporter.get_finished_spans() if s.name == "cachegate.route"]
    assert [dict(r.attributes or {}) for r in routes] == [
        {
            "cachegate.backend": "b1",
            "cachegate.route.reason": "prefix",
            "cachegate.route.attempt": 1,
            "cachegate.rank": 3,
            "cachegate.route.score.matched_tokens": 512.0,
            "cachegate.route.score.wait_s": 0.25,
            "cachegate.prefix.matched_tokens": 512,
        },
        {"cachegate.backend": "b2", "cachegate.route.reason": "retry", "cachegate.route.attempt": 2},
    ]
    assert all(r.parent is not None and r.parent.span_id == server.context.span_id for r in routes)
    assert all(r.start_time == r.end_time for r in routes), "a decision, not a wait"
    attrs = dict(server.attributes or {})
    assert attrs["cachegate.backend"] == "b2" and attrs["cachegate.route.attempt"] == 2
    assert not any(k.startswith("cachegate.route.score.") for k in attrs)


def test_a_retry_leaves_nothing_of_the_first_decision_on_the_request(rec: Recorder) -> None:
    t = rec.begin()
    t.routed(Dispatch("r", "b1", 3, "prefix", {"matched_tokens": 512.0}))
    t.routed(Dispatch("r", "b2", None, "retry", {}))
    t.end()
    attrs = dict(rec.spans()["chat"].attributes or {})
    assert attrs["cachegate.backend"] == "b2"
    assert "cachegate.rank" not in attrs and "cachegate.prefix.matched_tokens" not in attrs


def test_an_upstream_attempt_is_a_client_span_whose_context_goes_upstream(rec: Recorder) -> None:
    t = rec.begin()
    t.routed(Dispatch("r", "b1"))
    headers: dict[str, str] = {"authorization": "Bearer k"}
    hop = t.upstream("b1", URL, headers)
    hop.done(200)
    hop.done(500)  # a second end changes nothing
    t.end()
    client = rec.spans()["POST /v1/chat/completions"]
    assert client.kind == SpanKind.CLIENT and client.status.status_code == StatusCode.UNSET
    assert dict(client.attributes or {}) == {
        "http.request.method": "POST",
        "url.full": URL,
        "server.address": "10.0.0.7",
        "server.port": 30000,
        "url.template": "/v1/chat/completions",
        "cachegate.backend": "b1",
        "cachegate.route.attempt": 1,
        "http.response.status_code": 200,
    }
    trace_id, span_id = format(client.context.trace_id, "032x"), format(client.context.span_id, "016x")
    version, trace, parent, flags = headers["traceparent"].split("-")
    assert (version, trace, parent) == ("00", trace_id, span_id) and int(flags, 16) & 1, "sampled"
    assert client.parent is not None and client.parent.span_id == rec.spans()["chat"].context.span_id


@pytest.mark.parametrize(
    ("end", "error_type"),
    [
        (lambda hop: hop.done(503), "503"),
        (lambda hop: hop.done(200, "stream_broken"), "stream_broken"),
        (lambda hop: hop.failed("connect", httpx.ConnectError("refused")), "ConnectError"),
        (lambda hop: hop.failed("timeout"), "timeout"),
    ],
    ids=["5xx", "broken-stream", "connect-error", "timeout"],
)
def test_a_failed_attempt_ends_its_span_as_an_error(rec: Recorder, end: Any, error_type: str) -> None:
    t = rec.begin()
    end(t.upstream("b1", "http://backend/v1/completions", {}))
    t.end()
    client = rec.spans()["POST /v1/completions"]
    assert client.status.status_code == StatusCode.ERROR
    assert (client.attributes or {})["error.type"] == error_type
    assert "server.port" not in (client.attributes or {}), "no port in the URL: none recorded"


def test_an_exception_propagating_at_done_marks_the_attempt_failed(rec: Recorder) -> None:
    t = rec.begin()
    hop = t.upstream("b1", URL, {})
    try:
        raise httpx.ReadTimeout("silent")
    except httpx.ReadTimeout:
        hop.done(200)
    t.end()
    client = rec.spans()["POST /v1/chat/completions"]
    assert client.status.status_code == StatusCode.ERROR and (client.attributes or {})["error.type"] == "ReadTimeout"


def test_the_admission_span_says_how_the_wait_ended(rec: Recorder) -> None:
    outcomes = []
    for how in ("dispatched", "refused", "cancelled", "error", "refused-by-exception"):
        t = rec.begin(how)
        t.admission_started()
        refuse = Refuse("r", "team_queue_full", "full")
        if how == "dispatched":
            t.admission_done(0.5)
        elif how == "refused":
            t.admission_done(0.5, refuse)
        else:
            exc: BaseException = {
                "cancelled": asyncio.CancelledError(),
                "error": RuntimeError("x"),
                "refused-by-exception": type("Refused", (Exception,), {"refusal": refuse})(),
            }[how]
            try:
                raise exc
            except BaseException:
                t.admission_done(0.5)
        t.end()
        admission = next(
            s
            for s in rec.exporter.get_finished_spans()
            if s.name == "cachegate.admission" and s.parent and s.parent.span_id == rec.spans()[how].context.span_id
        )
        attrs, server = dict(admission.attributes or {}), dict(rec.spans()[how].attributes or {})
        assert attrs["cachegate.queue_wait_s"] == 0.5 == server["cachegate.queue_wait_s"]
        assert attrs["cachegate.admission.outcome"] == server["cachegate.admission.outcome"]
        outcomes.append((attrs["cachegate.admission.outcome"], server.get("cachegate.refusal.code")))
    assert outcomes == [
        ("dispatched", None),
        ("refused", "team_queue_full"),
        ("cancelled", None),
        ("error", None),
        ("refused", "team_queue_full"),
    ]


def test_the_first_token_is_one_event(rec: Recorder) -> None:
    t = rec.begin()
    t.first_token()
    t.first_token()
    t.end()
    assert [e.name for e in rec.spans()["chat"].events] == ["first_token"]


def test_the_answer_sets_usage_and_a_broken_stream_is_an_error(rec: Recorder) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 64}}
    cases = {
        "ok": (
            200,
            Result(usage=usage, finish_reasons=["stop"], response_model="m", first_token_at=1.0, output_chunks=9),
        ),
        "timeout": (200, Result(stream_error="timeout")),
        "odd": (200, Result(stream_error="something_else")),
        "bad": (502, Result()),
    }
    for name, (status, result) in cases.items():
        t = rec.begin(name)
        t.finished(status, result, "b1")
        t.end()
    spans = {name: dict(rec.spans()[name].attributes or {}) for name in cases}
    assert spans["ok"] == {
        "http.response.status_code": 200,
        "gen_ai.response.model": "m",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 64,
        "cachegate.cached_tokens": 64,
        "cachegate.output_chunks": 9,
    }
    assert rec.spans()["ok"].status.status_code == StatusCode.UNSET
    errors = {name: spans[name].get("error.type") for name in ("timeout", "odd", "bad")}
    assert errors == {"timeout": "upstream_timeout", "odd": "upstream_stream_error", "bad": "502"}
    assert all(rec.spans()[n].status.status_code == StatusCode.ERROR for n in errors)


def test_the_gateways_own_error_is_not_overwritten_by_the_exchange(rec: Recorder) -> None:
    t = rec.begin()
    t.failed(504, "upstream_timeout_first_byte")
    t.finished(504, Result(stream_error="timeout"))
    t.end()
    span = rec.spans()["chat"]
    assert (span.attributes or {})["error.type"] == "upstream_timeout_first_byte"
    assert span.status.description == "upstream_timeout_first_byte"


def test_a_client_that_left_is_a_499_unless_an_answer_had_a_status(rec: Recorder) -> None:
    gone, late = rec.begin("gone"), rec.begin("late")
    gone.end(client_left=True)
    late.finished(200, Result())
    late.end(client_left=True)
    for name, status in (("gone", 499), ("late", 200)):
        span = rec.spans()[name]
        attrs = dict(span.attributes or {})
        assert attrs["http.response.status_code"] == status and attrs["cachegate.client_disconnected"] is True
        assert attrs["error.type"] == "client_disconnected" and span.status.status_code == StatusCode.ERROR


def test_an_unsampled_trace_records_nothing_but_still_counts_attempts() -> None:
    rec = Recorder(sampled=False)
    t = rec.begin()
    assert not t.recording and t.exemplar() is None
    t.request("r", "t", parse(CHAT, "chat"))
    t.admission_started()
    t.admission_done(1.0)
    t.routed(Dispatch("r", "b1"))
    headers: dict[str, str] = {}
    t.upstream("b1", URL, headers).done(200)
    t.end()
    assert t.attempt == 1 and int(headers["traceparent"][-2:], 16) & 1 == 0, "propagated, not sampled"
    assert rec.exporter.get_finished_spans() == ()
    rec.provider.shutdown()


def test_a_sampled_trace_gives_its_id_as_the_exemplar(rec: Recorder) -> None:
    t = rec.begin()
    assert t.exemplar() == {"trace_id": format(t.span.get_span_context().trace_id, "032x")}
    t.end()


def test_the_null_trace_does_nothing() -> None:
    headers: dict[str, str] = {}
    hop = NULL_TRACE.upstream("b", URL, headers)
    assert isinstance(hop, UpstreamSpan) and hop.span is None and headers == {}
    hop.done(500)
    hop.failed("connect")
    NULL_TRACE.routed(Dispatch("r", "b"))
    NULL_TRACE.end(client_left=True)
    assert NULL_TRACE.attempt == 0 and NULL_TRACE.exemplar() is None and not NULL_TRACE.recording


async def test_the_trace_travels_with_the_requests_task(rec: Recorder) -> None:
    t = rec.begin()
    seen: list[RequestTrace] = []

    async def request() -> None:
        bind(t)
        seen.append(current_trace())
        await asyncio.create_task(child())

    async def child() -> None:
        seen.append(current_trace())

    assert current_trace() is NULL_TRACE
    await asyncio.create_task(request())
    assert seen == [t, t], "the request's task and a task it started"
    assert current_trace() is NULL_TRACE, "not the caller's"
    t.end()
