"""SGLang 0.5.23's own source, read without running its GPU-side package ``__init__``.

The fidelity tests check the twin against this, not against our reading of SGLang. The wheel is
installed with ``pip install --no-deps sglang==0.5.23`` (see the Makefile) plus ``msgspec``, the one
light package ``srt/entrypoints/openai/protocol.py`` needs beyond pydantic and openai.

- :func:`load_protocol` imports ``protocol.py`` under stub parent packages (``sglang``,
  ``sglang.srt``, ... are empty modules whose ``__path__`` points at the installed files, and
  ``sglang.utils`` is replaced by the one function protocol.py takes from it);
- :func:`routes` parses the route decorators of ``http_server.py`` and ``v1_loads.py``;
- :func:`metric_declarations` parses the ``sglang:`` metric constructors of
  ``observability/metrics_collector.py`` (kind, extra labels, buckets).
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PINNED_VERSION = "0.5.23"


@functools.cache
def sglang_root() -> Path:
    """Directory of the installed ``sglang`` package (found without importing it)."""
    loaded = sys.modules.get("sglang")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(next(iter(loaded.__path__)))
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("sglang is not installed: pip install --no-deps sglang==0.5.23")
    return Path(next(iter(spec.submodule_search_locations)))


def installed_version() -> str:
    return importlib.metadata.version("sglang")


@functools.cache
def load_protocol() -> types.ModuleType:
    """``sglang.srt.entrypoints.openai.protocol`` (pydantic models), loaded under stub parents."""
    name = "sglang.srt.entrypoints.openai.protocol"
    if name in sys.modules:
        return sys.modules[name]
    root = sglang_root()
    for pkg in ("sglang", "sglang.srt", "sglang.srt.entrypoints", "sglang.srt.entrypoints.openai"):
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(root.joinpath(*pkg.split(".")[1:]))]
            # A spec, so that importlib.util.find_spec() elsewhere still works on the stub.
            mod.__spec__ = importlib.machinery.ModuleSpec(pkg, None, is_package=True)
            mod.__spec__.submodule_search_locations = list(mod.__path__)
            sys.modules[pkg] = mod
    if "sglang.utils" not in sys.modules:
        utils = types.ModuleType("sglang.utils")

        def convert_json_schema_to_str(schema: Any) -> str:
            return schema if isinstance(schema, str) else json.dumps(schema)

        utils.convert_json_schema_to_str = convert_json_schema_to_str  # type: ignore[attr-defined]
        sys.modules["sglang.utils"] = utils
    spec = importlib.util.spec_from_file_location(name, root / "srt/entrypoints/openai/protocol.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def load_anthropic_protocol() -> types.ModuleType:
    """``sglang.srt.entrypoints.anthropic.protocol`` (SGLang's Anthropic models), under stub parents."""
    load_protocol()
    name = "sglang.srt.entrypoints.anthropic.protocol"
    if name in sys.modules:
        return sys.modules[name]
    pkg = "sglang.srt.entrypoints.anthropic"
    root = sglang_root()
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(root / "srt/entrypoints/anthropic")]
        sys.modules[pkg] = mod
    spec = importlib.util.spec_from_file_location(name, root / "srt/entrypoints/anthropic/protocol.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _const(node: ast.AST) -> Any:
    """A literal, or the default of ``os.environ.get(NAME, DEFAULT)``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and len(node.args) == 2:
        return _const(node.args[1])
    if isinstance(node, ast.List | ast.Tuple):
        return [_const(e) for e in node.elts]
    return None


def _routes_of(path: Path) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.args):
                continue
            kind = dec.func.attr
            route = _const(dec.args[0])
            if not isinstance(route, str):
                continue
            if kind in ("get", "post", "put", "delete", "head", "patch"):
                out.add((route, kind.upper()))
            elif kind == "api_route":
                methods = next((_const(k.value) for k in dec.keywords if k.arg == "methods"), ["GET"])
                out.update((route, m.upper()) for m in methods)
            elif kind == "websocket":
                out.add((route, "WEBSOCKET"))
    return out


@functools.cache
def routes() -> frozenset[tuple[str, str]]:
    """(path, method) of every route SGLang's HTTP server declares, plus the ``/metrics`` mount."""
    root = sglang_root() / "srt"
    found = _routes_of(root / "entrypoints/http_server.py") | _routes_of(root / "entrypoints/v1_loads.py")
    # /metrics is a Mount added by add_prometheus_middleware (utils/common.py) under --enable-metrics.
    if 'Mount("/metrics"' in (root / "utils/common.py").read_text():
        found.add(("/metrics", "GET"))
    return frozenset(found)


@dataclass(frozen=True)
class MetricDecl:
    name: str
    kind: str  # Gauge, Counter, Histogram
    collector: str  # the class whose __init__ declares it
    extra_labels: tuple[str, ...]  # labels beyond the collector's base labels
    buckets: tuple[float, ...] | None


@functools.cache
def metric_declarations() -> dict[str, MetricDecl]:
    """Every ``sglang:`` metric constructed in ``observability/metrics_collector.py``."""
    tree = ast.parse((sglang_root() / "srt/observability/metrics_collector.py").read_text())
    lists: dict[str, list[float]] = {}
    for node in ast.walk(tree):  # bucket lists: `bucket_x = [...]` (possibly under `if bucket_x is None`)
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.List)
        ):
            vals = _const(node.value)
            if vals and all(isinstance(v, int | float) for v in vals):
                lists.setdefault(node.targets[0].id, vals)
    out: dict[str, MetricDecl] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("Gauge", "Counter", "Histogram")
            ):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            name = _const(kw["name"]) if "name" in kw else None
            if not isinstance(name, str) or not name.startswith("sglang:"):
                continue
            extra: tuple[str, ...] = ()
            if "labelnames" in kw:
                extra = tuple(
                    c.value
                    for c in ast.walk(kw["labelnames"])
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
            buckets = None
            if "buckets" in kw:
                b = kw["buckets"]
                vals = lists.get(b.id) if isinstance(b, ast.Name) else _const(b)
                if isinstance(vals, list) and all(isinstance(v, int | float) for v in vals):
                    buckets = tuple(float(v) for v in vals)
            out.setdefault(name, MetricDecl(name, node.func.id, cls.name, extra, buckets))
    return out


@functools.cache
def load_kv_events() -> types.ModuleType:
    """``sglang.srt.disaggregation.kv_events`` (the event classes and ``ZmqEventPublisher``), loaded
    under stub parents: ``sglang.srt.utils.network`` is loaded from its file; ``sglang.srt.runtime_context``
    (which pulls torch) is a stub whose ``get_parallel`` the classes never call, and so is ``psutil`` when
    missing (network.py imports it for functions not used here). Needs pyzmq and msgspec."""
    load_protocol()  # the stub parents
    root = sglang_root()
    for pkg, rel in (("sglang.srt.utils", "srt/utils"), ("sglang.srt.disaggregation", "srt/disaggregation")):
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(root / rel)]
            sys.modules[pkg] = mod
    if "sglang.srt.runtime_context" not in sys.modules:
        ctx = types.ModuleType("sglang.srt.runtime_context")

        def get_parallel() -> Any:
            raise RuntimeError("stub: the twin's tests do not run SGLang's scheduler")

        ctx.get_parallel = get_parallel  # type: ignore[attr-defined]
        sys.modules["sglang.srt.runtime_context"] = ctx
    stub_psutil = importlib.util.find_spec("psutil") is None
    if stub_psutil:  # network.py imports it for functions the classes never call; removed again below
        sys.modules["psutil"] = types.ModuleType("psutil")
    try:
        _load_files(
            root,
            ("sglang.srt.utils.network", "srt/utils/network.py"),
            ("sglang.srt.disaggregation.kv_events", "srt/disaggregation/kv_events.py"),
        )
    finally:
        if stub_psutil:
            sys.modules.pop("psutil", None)
    return sys.modules["sglang.srt.disaggregation.kv_events"]


def _load_files(root: Path, *modules: tuple[str, str]) -> None:
    for name, rel in modules:
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, root / rel)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
