"""backends/sim/sglang_ref.py: reading SGLang 0.5.23's own source without its GPU package: the route and
metric parsers on small sources of known content (every decorator and constructor shape they read),
then on the installed release (facts the fidelity tests rely on), and the protocol modules loaded
under stub parents. The twin checked against them: tests/backends/test_twin_fidelity.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backends.sim import sglang_ref

SERVER = """
import os
app = object()
router = object()

@app.get("/health")
async def health(): ...

@app.api_route("/generate", methods=["POST", "PUT"])
async def generate(): ...

@app.api_route("/flush_cache")
async def flush(): ...

@router.post(os.environ.get("ROUTE", "/v1/chat/completions"))
def chat(): ...

@app.websocket("/v1/realtime")
async def ws(): ...

@app.get(PATH)
async def computed(): ...

@app.middleware("http")
async def mw(): ...

@staticmethod
def plain(): ...
"""

COLLECTOR = """
class TokenizerMetricsCollector:
    def __init__(self, labels, bucket_time_to_first_token=None):
        if bucket_time_to_first_token is None:
            bucket_time_to_first_token = [0.1, 0.5, 1]
        self.ttft = Histogram(name="sglang:time_to_first_token_seconds", documentation="x",
                              labelnames=list(labels.keys()) + ["is_streaming"], buckets=bucket_time_to_first_token)
        self.cached = Counter(name="sglang:cached_tokens_total", documentation="x",
                              labelnames=list(labels.keys()) + ["cache_source"])
        self.other = Counter(name="vllm:not_ours", documentation="x")
        self.lit = Histogram(name="sglang:e2e_request_latency_seconds", documentation="x", buckets=[1, 2.5])


class SchedulerMetricsCollector:
    def __init__(self, labels):
        self.running = Gauge(name="sglang:num_running_reqs", documentation="x", labelnames=labels.keys())
        self.again = Counter(name="sglang:cached_tokens_total", documentation="declared twice: the first wins")
"""


def _root(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_const_reads_literals_lists_and_environment_defaults() -> None:
    def const(src: str) -> object:
        return sglang_ref._const(ast.parse(src, mode="eval").body)

    assert const("'/x'") == "/x" and const("[1, 2.5]") == [1, 2.5] and const("('a', 'b')") == ["a", "b"]
    assert const("os.environ.get('X', '/default')") == "/default"
    assert const("NAME") is None and const("f(1)") is None


def test_routes_of_reads_every_decorator_shape(tmp_path: Path) -> None:
    path = _root(tmp_path, {"http_server.py": SERVER}) / "http_server.py"
    assert sglang_ref._routes_of(path) == {
        ("/health", "GET"),
        ("/generate", "POST"),
        ("/generate", "PUT"),
        ("/flush_cache", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/v1/realtime", "WEBSOCKET"),
    }


def test_routes_adds_the_metrics_mount_when_the_server_has_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _root(
        tmp_path,
        {
            "srt/entrypoints/http_server.py": SERVER,
            "srt/entrypoints/v1_loads.py": '@router.get("/v1/loads")\ndef loads(): ...\n',
            "srt/utils/common.py": 'routes = [Mount("/metrics", app=metrics_app)]\n',
        },
    )
    monkeypatch.setattr(sglang_ref, "sglang_root", lambda: root)
    found = sglang_ref.routes.__wrapped__()
    assert {("/v1/loads", "GET"), ("/metrics", "GET"), ("/health", "GET")} <= found
    (root / "srt/utils/common.py").write_text("no mount here\n")
    assert ("/metrics", "GET") not in sglang_ref.routes.__wrapped__()


def test_metric_declarations_read_kind_collector_extra_labels_and_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(tmp_path, {"srt/observability/metrics_collector.py": COLLECTOR})
    monkeypatch.setattr(sglang_ref, "sglang_root", lambda: root)
    got = sglang_ref.metric_declarations.__wrapped__()
    M = sglang_ref.MetricDecl
    assert got == {
        "sglang:time_to_first_token_seconds": M(
            "sglang:time_to_first_token_seconds",
            "Histogram",
            "TokenizerMetricsCollector",
            ("is_streaming",),
            (0.1, 0.5, 1.0),
        ),
        "sglang:cached_tokens_total": M(
            "sglang:cached_tokens_total", "Counter", "TokenizerMetricsCollector", ("cache_source",), None
        ),
        "sglang:e2e_request_latency_seconds": M(
            "sglang:e2e_request_latency_seconds", "Histogram", "TokenizerMetricsCollector", (), (1.0, 2.5)
        ),
        "sglang:num_running_reqs": M("sglang:num_running_reqs", "Gauge", "SchedulerMetricsCollector", (), None),
    }


def test_the_installed_release_is_the_pinned_one_and_is_read_as_expected() -> None:
    assert sglang_ref.installed_version() == sglang_ref.PINNED_VERSION == "0.5.23"
    assert (sglang_ref.sglang_root() / "srt/entrypoints/http_server.py").is_file()
    routes = sglang_ref.routes()
    assert {
        ("/generate", "POST"),
        ("/v1/chat/completions", "POST"),
        ("/v1/loads", "GET"),
        ("/metrics", "GET"),
    } <= routes
    assert ("/v1/realtime", "WEBSOCKET") in routes and not any(p == "/get_load" for p, _ in routes)
    decls = sglang_ref.metric_declarations()
    ttft = decls["sglang:time_to_first_token_seconds"]
    assert (ttft.kind, ttft.collector, ttft.extra_labels) == (
        "Histogram",
        "TokenizerMetricsCollector",
        ("is_streaming",),
    )
    assert ttft.buckets is not None and ttft.buckets[0] == 0.1
    assert decls["sglang:num_running_reqs"].collector.startswith("Scheduler")


def test_the_protocol_modules_load_once_under_stub_parents() -> None:
    protocol = sglang_ref.load_protocol()
    assert protocol is sglang_ref.load_protocol()
    request = protocol.ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    )
    assert request.stream is False
    anthropic = sglang_ref.load_anthropic_protocol()
    assert (
        anthropic.AnthropicMessagesRequest.model_validate(
            {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        ).max_tokens
        == 1
    )
    events = sglang_ref.load_kv_events()
    assert {"BlockStored", "BlockRemoved", "AllBlocksCleared", "ZmqEventPublisher"} <= set(dir(events))
