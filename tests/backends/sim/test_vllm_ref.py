"""backends/sim/vllm_ref.py: reading vLLM 0.33.0's own source without torch: the parsers (metric
constructors and their label names, ``CacheConfig``'s fields, router decorators, the DP-rank header) on
small sources of known content, then on the installed release, and its protocol module loaded under
stub parents. The twin checked against them: tests/backends/test_twin_vllm.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from backends.sim import vllm_ref

LOGGERS = """
class PrometheusStatLogger:
    def __init__(self):
        labelnames = ["model_name", "engine"]
        self.running = self._gauge_cls(name="vllm:num_requests_running", documentation="x", labelnames=labelnames)
        self.success = self._counter_cls(name="vllm:request_success", documentation="x",
                                         labelnames=labelnames + ["finished_reason"])
        self.ttft = self._histogram_cls(name="vllm:time_to_first_token_seconds", documentation="x",
                                        labelnames=["model_name"])
        self.odd = self._gauge_cls(name="vllm:computed_labels", documentation="x", labelnames=make_labels())
        self.not_a_metric = self._gauge_cls(documentation="no name")

    def log_metrics_info(self, type, config_obj):
        name = "vllm:cache_config_info"
        other = "vllm:info_is_not_last"
        label = "engine_info"
"""

CACHE = """
from typing import ClassVar
class Other:
    ignored: int = 0
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    DEFAULTS: ClassVar[dict] = {}
    def method(self) -> None:
        local: int = 1
"""

SERVING = """
class Serving:
    def _get_data_parallel_rank(raw_request):
        if raw_request is None:
            return None
        value = raw_request.headers.get("X-data-parallel-rank")
        return int(value)
"""


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture()
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(vllm_ref, "vllm_root", lambda: tmp_path)
    return tmp_path


def test_labels_read_the_base_names_their_sums_and_literal_lists() -> None:
    def labels(src: str) -> tuple[str, ...] | None:
        return vllm_ref._labels(ast.parse(src, mode="eval").body)

    assert labels("labelnames") == ("model_name", "engine")
    assert labels('labelnames + ["finished_reason"]') == ("model_name", "engine", "finished_reason")
    assert labels('["a", "b"]') == ("a", "b")
    assert labels("other") is None and labels("labelnames + make()") is None and labels('["a", x]') is None
    assert vllm_ref._labels(None) is None


def test_metric_declarations_of_a_loggers_source(fake_root: Path) -> None:
    _write(fake_root, "v1/metrics/loggers.py", LOGGERS)
    M = vllm_ref.MetricDecl
    assert vllm_ref.metric_declarations.__wrapped__() == {
        "vllm:num_requests_running": M("vllm:num_requests_running", "gauge", ("model_name", "engine")),
        "vllm:request_success": M("vllm:request_success", "counter", ("model_name", "engine", "finished_reason")),
        "vllm:time_to_first_token_seconds": M("vllm:time_to_first_token_seconds", "histogram", ("model_name",)),
        "vllm:computed_labels": M("vllm:computed_labels", "gauge", None),
        "vllm:cache_config_info": M("vllm:cache_config_info", "gauge", None),
    }


def test_cache_config_fields_are_its_annotated_fields_but_class_vars(fake_root: Path) -> None:
    _write(fake_root, "config/cache.py", CACHE)
    assert vllm_ref.cache_config_fields.__wrapped__() == {"block_size", "cache_dtype"}
    _write(fake_root, "config/cache.py", "class Other:\n    x: int = 1\n")
    with pytest.raises(LookupError, match="CacheConfig not found"):
        vllm_ref.cache_config_fields.__wrapped__()


def test_routes_are_every_router_get_and_post_under_entrypoints(fake_root: Path) -> None:
    _write(
        fake_root,
        "entrypoints/openai/api_router.py",
        '@router.post("/v1/chat/completions")\nasync def chat(): ...\n'
        '@router.get("/v1/models")\nasync def models(): ...\n'
        '@router.put("/v1/ignored")\nasync def put(): ...\n'
        "@router.get(PATH)\nasync def computed(): ...\n",
    )
    _write(fake_root, "entrypoints/serve/health.py", '@router.get("/health")\ndef health(): ...\n')
    _write(fake_root, "entrypoints/no_router.py", '@app.get("/not_a_router_route")\ndef x(): ...\n')
    assert vllm_ref.routes.__wrapped__() == {
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/health"),
    }


def test_rank_header_is_the_header_the_rank_function_reads(fake_root: Path) -> None:
    _write(fake_root, "entrypoints/generate/base/serving.py", SERVING)
    assert vllm_ref.rank_header.__wrapped__() == "X-data-parallel-rank"
    _write(fake_root, "entrypoints/generate/base/serving.py", "def other(): ...\n")
    with pytest.raises(LookupError):
        vllm_ref.rank_header.__wrapped__()


def test_the_installed_release_is_the_pinned_one_and_is_read_as_expected() -> None:
    assert vllm_ref.installed_version() == vllm_ref.PINNED_VERSION == "0.33.0"
    assert vllm_ref.rank_header() == "X-data-parallel-rank"
    assert {("GET", "/health"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models")} <= vllm_ref.routes()
    decls = vllm_ref.metric_declarations()
    assert decls["vllm:request_success"].labels == ("model_name", "engine", "finished_reason")
    assert decls["vllm:cache_config_info"].labels is None
    assert {"block_size", "num_gpu_blocks", "enable_prefix_caching"} <= vllm_ref.cache_config_fields()


def test_the_protocol_module_loads_once_under_stub_parents() -> None:
    protocol = vllm_ref.load_protocol()
    assert protocol is vllm_ref.load_protocol()
    err = protocol.ErrorResponse.model_validate({"error": {"message": "m", "type": "t", "code": 400}})
    assert err.error.code == 400
    card = protocol.ModelList.model_validate({"data": [{"id": "m", "max_model_len": 8}]}).data[0]
    assert (card.id, card.max_model_len, card.object) == ("m", 8, "model")
