"""deploy/vllm/ launch scripts: they parse, build the intended command line, and use only flags (and
parser and dtype values) that vLLM 0.33.0 defines.

vLLM registers its engine flags by hand in ``vllm/engine/arg_utils.py`` (``add_argument("--x", ...)``) and
derives the OpenAI server's from ``FrontendArgs``' fields (``vllm/entrypoints/common/cli_args.py``:
``--`` + field name with ``-`` for ``_``); ``vllm serve`` adds ``--headless`` there too. All are read here
with ``ast`` from the installed wheel (``backends/sim/vllm_ref.py``): nothing of vLLM is imported.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
from pathlib import Path

import pytest

from backends.sim import vllm_ref

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "deploy" / "vllm").glob("*.sh"))
REQUIRED = [
    "--trust-remote-code",
    "--kv-cache-dtype",
    "--enable-prefix-caching",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--reasoning-parser",
    "--enable-prompt-tokens-details",
    "--otlp-traces-endpoint",
    "--max-model-len",
]
MULTINODE = {"NODE_RANK": "3", "MASTER_ADDR": "spark-0"}


@functools.cache
def vllm_flags() -> frozenset[str]:
    root = vllm_ref.vllm_root()
    flags: set[str] = set()
    for path in ("engine/arg_utils.py", "entrypoints/common/cli_args.py"):
        tree = ast.parse((root / path).read_text())
        flags |= {
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"--[a-z0-9-]+", n.value)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in ("BaseFrontendArgs", "FrontendArgs"):
                flags |= {
                    "--" + s.target.id.replace("_", "-")
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
    return frozenset(flags)


def run_script(script: Path, tmp_path: Path, **env: str) -> list[str]:
    """Run the script with a stand-in `vllm` that prints its argv: the exact command line it builds."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "vllm").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (shim / "vllm").chmod(0o755)
    base = {"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(
        ["bash", str(script)], env={**base, **env}, capture_output=True, text=True, timeout=10, check=True
    )
    return out.stdout.splitlines()


def values(argv: list[str]) -> dict[str, str]:
    return {a: argv[i + 1] if i + 1 < len(argv) else "" for i, a in enumerate(argv) if a.startswith("--")}


def test_scripts_exist_for_b300_and_gb10_and_the_readme_lists_them() -> None:
    names = {p.name for p in SCRIPTS}
    assert {"b300-tp8-fp8.sh", "b300-dp8-ep8-fp8.sh", "gb10x16-tp4pp4-fp8.sh"} <= names
    readme = (ROOT / "deploy" / "vllm" / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names)


def test_the_flag_reader_finds_vllms_flags() -> None:
    flags = vllm_flags()
    assert {"--tensor-parallel-size", "--max-num-seqs", "--served-model-name", "--tool-call-parser"} <= flags
    assert {"--enable-prompt-tokens-details", "--headless", "--nnodes"} <= flags
    assert "--tp-size" not in flags and "--no-such-flag" not in flags  # SGLang's spelling is not vLLM's
    assert len(flags) > 150


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_command_line_uses_only_vllm_flags(script: Path, tmp_path: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    argv = run_script(script, tmp_path, **MULTINODE)
    assert (argv[0] == "serve" and argv[1] == "moonshotai/Kimi-K2.5") or argv[1] == "moonshotai/Kimi-K2-Instruct"
    flags = {a for a in argv if a.startswith("--")}
    assert set(REQUIRED) <= flags, sorted(set(REQUIRED) - flags)
    unknown = sorted(flags - vllm_flags())
    assert not unknown, f"{script.name}: not vLLM {vllm_ref.PINNED_VERSION} flags: {unknown}"
    v = values(argv)
    assert v["--tool-call-parser"] == v["--reasoning-parser"] == "kimi_k2"
    assert v["--kv-cache-dtype"] == "fp8" and v["--max-model-len"] == "262144"
    text = script.read_text().splitlines()  # every flag says what it is for
    for i, line in enumerate(text):
        if line.strip().startswith("--"):
            assert " # " in line or text[i - 1].strip().startswith("#"), f"{script.name}: no comment: {line.strip()}"


def test_layouts(tmp_path: Path) -> None:
    tp = values(run_script(ROOT / "deploy/vllm/b300-tp8-fp8.sh", tmp_path))
    assert tp["--tensor-parallel-size"] == "8"
    dp = values(run_script(ROOT / "deploy/vllm/b300-dp8-ep8-fp8.sh", tmp_path))
    assert dp["--data-parallel-size"] == "8" and "--enable-expert-parallel" in dp
    gb10 = ROOT / "deploy/vllm/gb10x16-tp4pp4-fp8.sh"
    worker = values(run_script(gb10, tmp_path, **MULTINODE))
    layout = (worker["--tensor-parallel-size"], worker["--pipeline-parallel-size"], worker["--nnodes"])
    assert layout == ("4", "4", "16")
    assert worker["--node-rank"] == "3" and worker["--master-addr"] == "spark-0" and "--headless" in worker
    head = values(run_script(gb10, tmp_path, NODE_RANK="0", MASTER_ADDR="spark-0"))
    assert "--headless" not in head
    with pytest.raises(subprocess.CalledProcessError) as err:
        run_script(gb10, tmp_path, MASTER_ADDR="spark-0")
    assert "NODE_RANK" in err.value.stderr


def test_parser_and_dtype_values_exist_in_vllm() -> None:
    root = vllm_ref.vllm_root()
    assert '"kimi_k2"' in (root / "tool_parsers/__init__.py").read_text()
    assert '"kimi_k2"' in (root / "reasoning/__init__.py").read_text()
    cache = (root / "config/cache.py").read_text()
    dtypes = re.search(r"CacheDType = Literal\[(.*?)\]", cache, re.S)
    assert dtypes is not None and '"fp8"' in dtypes.group(1)
