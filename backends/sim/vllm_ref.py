"""vLLM 0.33.0's own source, read without running its package ``__init__`` (which imports torch).

The engine-adapter and twin tests check cachegate's vLLM dialect against this, not against our
reading of vLLM. The wheel is installed with ``pip install --no-deps vllm==0.33.0`` (the Makefile);
none of its modules imports without its GPU stack (``vllm/__init__.py`` imports ``torch``), so:

- :func:`load_protocol` imports ``vllm/entrypoints/serve/engine/protocol.py`` (``ErrorResponse``,
  ``ModelCard``, ``ModelList``; pydantic only) under stub parents, with ``vllm.logger`` and
  ``vllm.utils`` replaced by the two names it takes from them;
- :func:`metric_declarations` parses the ``vllm:`` metric constructors of ``v1/metrics/loggers.py``;
- :func:`cache_config_fields` parses ``CacheConfig``'s fields (the labels of ``vllm:cache_config_info``);
- :func:`routes` parses the route decorators of every ``api_router.py`` and ``instrumentator/*.py``;
- :func:`rank_header` finds the header ``_get_data_parallel_rank`` reads.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import sys
import types
import uuid
from dataclasses import dataclass
from pathlib import Path

PINNED_VERSION = "0.33.0"
_KINDS = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
_BASE_LABELS = ("model_name", "engine")
"""``labelnames = ["model_name", "engine"]`` in ``PrometheusStatLogger.__init__``."""


@functools.cache
def vllm_root() -> Path:
    """Directory of the installed ``vllm`` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("vllm is not installed: pip install --no-deps vllm==0.33.0")
    return Path(next(iter(spec.submodule_search_locations)))


def installed_version() -> str:
    return importlib.metadata.version("vllm")


@dataclass(frozen=True, slots=True)
class MetricDecl:
    name: str
    kind: str
    labels: tuple[str, ...] | None
    """None when the label names are computed at run time (``vllm:cache_config_info``: its config's fields)."""


def _labels(node: ast.expr | None) -> tuple[str, ...] | None:
    """``labelnames=labelnames``, ``labelnames + ["x"]`` or a literal list."""
    if isinstance(node, ast.Name) and node.id == "labelnames":
        return _BASE_LABELS
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _labels(node.left), _labels(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) for e in node.elts):
        return tuple(str(e.value) for e in node.elts if isinstance(e, ast.Constant))
    return None


@functools.cache
def metric_declarations() -> dict[str, MetricDecl]:
    """Every ``self._gauge_cls(name="vllm:...")`` (and counter, histogram) of ``loggers.py``, and the
    info gauge ``log_metrics_info`` declares (``name = "vllm:cache_config_info"``)."""
    tree = ast.parse((vllm_root() / "v1/metrics/loggers.py").read_text())
    out: dict[str, MetricDecl] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _KINDS:
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            name = kw.get("name")
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                out[name.value] = MetricDecl(name.value, _KINDS[node.func.attr], _labels(kw.get("labelnames")))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, str) and value.endswith("_info") and value.startswith("vllm:"):
                out[value] = MetricDecl(value, "gauge", None)  # "Info type metrics ... emulate info with a gauge"
    return out


@functools.cache
def cache_config_fields() -> frozenset[str]:
    """The field names of ``CacheConfig`` (``metrics_info()`` turns each into a label)."""
    tree = ast.parse((vllm_root() / "config/cache.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "CacheConfig":
            return frozenset(
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and "ClassVar" not in ast.unparse(s.annotation)
            )
    raise LookupError("CacheConfig not found in vllm/config/cache.py")


@functools.cache
def routes() -> frozenset[tuple[str, str]]:
    """``(METHOD, path)`` of every ``@router.get/post(...)`` under ``vllm/entrypoints``."""
    found: set[tuple[str, str]] = set()
    for path in (vllm_root() / "entrypoints").rglob("*.py"):
        text = path.read_text()
        if "@router." not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in node.decorator_list:
                if (
                    isinstance(dec, ast.Call)
                    and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr in ("get", "post")
                    and dec.args
                    and isinstance(dec.args[0], ast.Constant)
                ):
                    found.add((dec.func.attr.upper(), str(dec.args[0].value)))
    return frozenset(found)


@functools.cache
def rank_header() -> str:
    """The header vLLM's ``_get_data_parallel_rank`` reads the DP rank from."""
    tree = ast.parse((vllm_root() / "entrypoints/generate/base/serving.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_get_data_parallel_rank":
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "get"
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                ):
                    return str(call.args[0].value)
    raise LookupError("_get_data_parallel_rank not found")


def _stub(name: str, path: Path | None = None) -> types.ModuleType:
    mod = types.ModuleType(name)
    if path is not None:
        mod.__path__ = [str(path)]
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mod.__spec__.submodule_search_locations = list(mod.__path__)
    return mod


@functools.cache
def load_protocol() -> types.ModuleType:
    """``vllm.entrypoints.serve.engine.protocol`` (pydantic models), loaded under stub parents."""
    name = "vllm.entrypoints.serve.engine.protocol"
    if name in sys.modules:
        return sys.modules[name]
    root = vllm_root()
    for pkg in ("vllm", "vllm.entrypoints", "vllm.entrypoints.serve", "vllm.entrypoints.serve.engine"):
        sys.modules.setdefault(pkg, _stub(pkg, root.joinpath(*pkg.split(".")[1:])))
    if "vllm.logger" not in sys.modules:
        logger_mod = _stub("vllm.logger")

        def init_logger(logger_name: str) -> logging.Logger:
            logger = logging.getLogger(logger_name)
            logger.warning_once = logger.warning  # type: ignore[attr-defined]
            return logger

        logger_mod.init_logger = init_logger  # type: ignore[attr-defined]
        sys.modules["vllm.logger"] = logger_mod
    if "vllm.utils" not in sys.modules:
        utils = _stub("vllm.utils")
        utils.random_uuid = lambda: uuid.uuid4().hex  # type: ignore[attr-defined]
        sys.modules["vllm.utils"] = utils
    spec = importlib.util.spec_from_file_location(name, root / "entrypoints/serve/engine/protocol.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
