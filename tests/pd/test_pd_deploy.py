"""deploy/sglang/'s disaggregated pair: the flags and values SGLang 0.5.23 defines for each role."""

from __future__ import annotations

import re
from pathlib import Path

from backends.sim import sglang_ref
from tests.deploy.test_deploy_sglang import ROOT, run_script, sglang_flags

PAIR = ("b300-tp8-fp8-pd-prefill.sh", "b300-tp8-fp8-pd-decode.sh")


def _values(name: str, tmp_path: Path, **env: str) -> dict[str, str]:
    argv = run_script(ROOT / "deploy" / "sglang" / name, tmp_path, **env)
    return {a: argv[i + 1] if i + 1 < len(argv) else "" for i, a in enumerate(argv) if a.startswith("--")}


def test_each_side_runs_its_role_with_one_transfer_backend(tmp_path: Path) -> None:
    prefill, decode = (_values(n, tmp_path) for n in PAIR)
    assert prefill["--disaggregation-mode"] == "prefill" and prefill["--disaggregation-bootstrap-port"] == "8998"
    assert decode["--disaggregation-mode"] == "decode" and "--disaggregation-bootstrap-port" not in decode
    assert prefill["--disaggregation-transfer-backend"] == decode["--disaggregation-transfer-backend"] == "mooncake"
    assert prefill["--kv-cache-dtype"] == decode["--kv-cache-dtype"]
    nics = _values(PAIR[0], tmp_path, IB_DEVICE="mlx5_0,mlx5_1", BOOTSTRAP_PORT="9000")
    assert nics["--disaggregation-ib-device"] == "mlx5_0,mlx5_1" and nics["--disaggregation-bootstrap-port"] == "9000"
    assert "--disaggregation-ib-device" not in prefill


def test_the_pd_flags_and_values_are_sglangs(tmp_path: Path) -> None:
    for name in PAIR:
        argv = run_script(ROOT / "deploy" / "sglang" / name, tmp_path, IB_DEVICE="mlx5_0")
        assert not {a for a in argv if a.startswith("--")} - sglang_flags(), name
    srt = sglang_ref.sglang_root() / "srt"
    fields = (srt / "arg_groups" / "fields" / "disagg.py").read_text()
    assert re.search(r'disaggregation_mode: A\[\s*Literal\["null", "prefill", "decode"\]', fields)
    assert re.search(r"disaggregation_bootstrap_port: A\[\s*int, [^\]]*\] = 8998", fields)
    choices = (srt / "arg_groups" / "choices.py").read_text()
    block = choices[choices.index("DISAGG_TRANSFER_BACKEND_CHOICES = [") :]
    assert '"mooncake"' in block[: block.index("]")] and '"nixl"' in block[: block.index("]")]
