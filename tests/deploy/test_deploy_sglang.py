"""deploy/sglang/ launch scripts: they parse, build the intended command line, and use only flags (and
parser/dtype values) that SGLang 0.5.23 defines.

SGLang 0.5.23 derives most CLI flags from annotated dataclass fields (``sglang/srt/arg_groups/fields``,
``--`` + field name with ``-`` for ``_``, plus ``Arg(cli_name=..., aliases=[...])``) and registers the rest
by hand in ``sglang/srt/server_args.py``; both are read here with ``ast``, nothing of sglang is imported.
The source comes from an installed ``sglang==0.5.23`` (``pip install --no-deps``) or else from the wheel,
fetched once with ``pip download --no-deps`` into ``~/.cache/cachegate-tests``.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "deploy" / "sglang").glob("*.sh"))
SGLANG_VERSION = "0.5.23"
REQUIRED = [
    "--enable-metrics",
    "--enable-cache-report",
    "--enable-trace",
    "--otlp-traces-endpoint",
    "--tool-call-parser",
    "--reasoning-parser",
    "--trust-remote-code",
    "--kv-cache-dtype",
]
SOURCES = (
    "sglang/srt/server_args.py",
    "sglang/srt/arg_groups/fields/",
    "sglang/srt/parser/reasoning_parser_names.py",
    "sglang/srt/function_call/parser_names.py",
)


def _from_installed() -> dict[str, str] | None:
    try:
        if importlib.metadata.version("sglang") != SGLANG_VERSION:
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("sglang")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))).parent
    return {
        str(p.relative_to(base)): p.read_text()
        for p in base.glob("sglang/srt/**/*.py")
        if str(p.relative_to(base)).startswith(SOURCES)
    }


def _from_wheel() -> dict[str, str]:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cachegate-tests"
    wheels = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), f"sglang=={SGLANG_VERSION}"],
            check=True,
            timeout=300,
        )
        wheels = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        return {n: wheel.read(n).decode() for n in wheel.namelist() if n.startswith(SOURCES) and n.endswith(".py")}


@functools.cache
def sglang_sources() -> dict[str, str]:
    return _from_installed() or _from_wheel()


def _is_annotated(node: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("A", "Annotated")


def _field_flags(source: str) -> set[str]:
    """CLI names of the annotated dataclass fields, as add_cli_args_from_dataclass derives them."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_annotated(node.annotation)
        ):
            continue
        assert isinstance(node.annotation, ast.Subscript)
        parts = node.annotation.slice.elts if isinstance(node.annotation.slice, ast.Tuple) else []
        metas = parts[1:]
        arg = next((m for m in metas if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg"), None)
        has_help = any(isinstance(m, ast.Constant) and isinstance(m.value, str) for m in metas)
        if arg is None and not has_help:
            continue  # no Arg metadata: not registered automatically
        kw = {k.arg: k.value for k in arg.keywords} if arg is not None else {}
        if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
            continue
        cli = kw.get("cli_name")
        flags.add(cli.value if isinstance(cli, ast.Constant) else "--" + node.target.id.replace("_", "-"))
        aliases = kw.get("aliases")
        if isinstance(aliases, ast.List):
            flags |= {a.value for a in aliases.elts if isinstance(a, ast.Constant)}
    return flags


def _literal_list(source: str, name: str) -> list[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == name for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{name} not found")


@functools.cache
def sglang_flags() -> frozenset[str]:
    flags: set[str] = set()
    for path, text in sglang_sources().items():
        if path.startswith("sglang/srt/arg_groups/fields/"):
            flags |= _field_flags(text)
    manual = sglang_sources()["sglang/srt/server_args.py"]
    flags |= {
        n.value
        for n in ast.walk(ast.parse(manual))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)
    }
    return frozenset(flags)


def run_script(script: Path, tmp_path: Path, **env: str) -> list[str]:
    """Run the script with a stand-in `python3` that prints its argv: the exact command line it builds."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (shim / "python3").chmod(0o755)
    base = {"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(
        ["bash", str(script)], env={**base, **env}, capture_output=True, text=True, timeout=10, check=True
    )
    return out.stdout.splitlines()


MULTINODE = {"NODE_RANK": "3", "DIST_INIT_ADDR": "spark-0:50000"}


def test_scripts_exist_for_every_variant() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"b300-tp8-fp8.sh", "b300-dp8-fp8.sh", "b300-tp8-fp8-hicache.sh", "gb10x16-tp4pp4-fp8.sh"} <= names
    readme = (ROOT / "deploy" / "sglang" / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names), "README table lists every script"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_command_line(script: Path, tmp_path: Path) -> None:
    argv = run_script(script, tmp_path, **MULTINODE, ATTENTION_BACKEND="triton")
    assert argv[:2] == ["-m", "sglang.launch_server"]
    flags = [a for a in argv if a.startswith("--")]
    for flag in REQUIRED:
        assert flag in flags, f"{script.name} lacks {flag}"
    value = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert value["--tool-call-parser"] == value["--reasoning-parser"] == "kimi_k2"
    assert value["--kv-cache-dtype"] == "fp8_e4m3"
    assert value["--otlp-traces-endpoint"] == "otel-collector:4317"
    if script.name.startswith("gb10"):
        assert value["--node-rank"] == "3" and value["--dist-init-addr"] == "spark-0:50000"
        assert value["--nnodes"] == "16" and value["--attention-backend"] == "triton"
    # Every flag carries a comment saying what it is for (on its line, or the line above).
    text = script.read_text().splitlines()
    for i, line in enumerate(text):
        stripped = line.strip()
        if stripped.startswith("--"):
            assert " # " in line or text[i - 1].strip().startswith("#"), f"{script.name}: no comment: {stripped}"


def test_layouts(tmp_path: Path) -> None:
    def values(name: str) -> dict[str, str]:
        argv = run_script(ROOT / "deploy" / "sglang" / name, tmp_path, **MULTINODE)
        return {a: argv[i + 1] if i + 1 < len(argv) else "" for i, a in enumerate(argv) if a.startswith("--")}

    assert values("b300-tp8-fp8.sh")["--tp-size"] == "8"
    dp = values("b300-dp8-fp8.sh")
    assert dp["--tp-size"] == "8" and dp["--attn-dp-size"] == "8"
    dcp = values("b300-tp8-fp8-dcp8.sh")
    assert dcp["--tp-size"] == dcp["--dcp-size"] == "8" and "--attn-dp-size" not in dcp
    hi = values("b300-tp8-fp8-hicache.sh")
    assert "--enable-hierarchical-cache" in hi and hi["--hicache-size"] == "280"
    pp = values("gb10x16-tp4pp4-fp8.sh")
    assert (pp["--tp-size"], pp["--pp-size"]) == ("4", "4")
    assert "--attention-backend" not in pp  # only when ATTENTION_BACKEND is set


def test_multinode_scripts_require_node_rank(tmp_path: Path) -> None:
    for script in SCRIPTS:
        if script.name.startswith("gb10"):
            with pytest.raises(subprocess.CalledProcessError) as err:
                run_script(script, tmp_path, DIST_INIT_ADDR="spark-0:50000")
            assert "NODE_RANK" in err.value.stderr


def test_flag_parser_reads_sglang_sources() -> None:
    flags = sglang_flags()
    # Known flags of both kinds (auto-derived, aliases, hand-registered) are found; invented ones are not.
    assert {
        "--tp-size",
        "--tensor-parallel-size",
        "--enable-metrics",
        "--tool-call-parser",
        "--disable-cuda-graph",
    } <= flags
    assert "--enable-dp-attention" in flags  # hand-registered (deprecated) although its field is no_cli
    assert "--no-such-flag" not in flags and "--tp" not in flags
    assert len(flags) > 300


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_flags_exist_in_sglang(script: Path, tmp_path: Path) -> None:
    argv = run_script(script, tmp_path, **MULTINODE, ATTENTION_BACKEND="triton")
    unknown = sorted({a for a in argv if a.startswith("--")} - sglang_flags())
    assert not unknown, f"{script.name}: not SGLang {SGLANG_VERSION} flags: {unknown}"


def test_parser_and_dtype_values_exist_in_sglang() -> None:
    src = sglang_sources()
    assert "kimi_k2" in _literal_list(src["sglang/srt/parser/reasoning_parser_names.py"], "REASONING_PARSER_NAMES")
    assert "kimi_k2" in _literal_list(src["sglang/srt/function_call/parser_names.py"], "TOOL_CALL_PARSER_NAMES")
    model_fields = src["sglang/srt/arg_groups/fields/model.py"]
    assert re.search(r'kv_cache_dtype: A\[.*?"fp8_e4m3"', model_fields, re.S)
