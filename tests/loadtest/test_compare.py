"""`cachegate compare`: issue 32's acceptance lines judge the gateway against the best of direct and
sglang-cache-aware, and the command prints every stack beside the ceiling with the verdicts."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gateway.cli import app
from loadtest.analysis.compare import STACKS, Cell, from_json, judge, summary


def row(tpm: float, p50: float, p95: float, longest: float) -> dict:
    return {"total_tpm": tpm, "ttft_p50_s": p50, "ttft_p95_s": p95, "max_wait_s": longest}


def cell(level: int, gateway: dict, direct: dict, sglang: dict) -> Cell:
    return Cell(level, 1, rows={"gateway": gateway, "direct": direct, "sglang-cache-aware": sglang, "ceiling": direct})


def test_four_lines_against_the_best_of_direct_and_sglang() -> None:
    c = cell(64, row(9.8e6, 1.0, 10.0, 60.0), row(10e6, 2.0, 9.0, 80.0), row(8e6, 0.95, 20.0, 50.0))
    judge("b300-dp8-fp8-cp", [c])
    verdict = {k.figure: k.ok for k in c.checks}
    # 9.8M >= 0.98 x 10M; 1.0 <= 1.05 x 0.95 + 0.05; 10 > 1.05 x 9 + 0.05; 60 <= 1.1 x 50 + 5
    assert verdict == {"total_tpm": True, "ttft_p50_s": True, "ttft_p95_s": False, "max_wait_s": True}
    passed, total, failed = summary([c])
    assert (passed, total) == (3, 4) and failed == ["64 conv. seed 1: ttft_p95_s 10 s ≤ 9.50 s fails"]


def test_past_direct_collapse_the_overload_lines_apply_and_below_its_peak_the_four() -> None:
    low = cell(8, row(4e6, 0.3, 1.0, 3.0), row(4e6, 0.3, 1.0, 3.0), row(4e6, 0.3, 1.0, 3.0))
    peak = cell(32, row(7e6, 0.4, 2.0, 5.0), row(7e6, 0.4, 2.0, 5.0), row(7e6, 0.4, 2.0, 5.0))
    over = cell(64, row(5e6, 0.5, 30.0, 290.0), row(2.4e6, 1.5, 37.0, 52.0), row(2.4e6, 1.5, 37.0, 52.0))
    judge("b300-tp8-fp8", [low, peak, over])
    assert len(low.checks) == 4 and low.ok  # below the peak: demand-bound, the four lines
    assert {k.figure: k.limit for k in over.checks} == {"total_tpm": 4.8e6, "ttft_p95_s": 37.0, "max_wait_s": 300.0}
    assert over.ok
    bf16 = cell(96, row(3e6, 0.5, 30.0, 290.0), row(1.4e6, 89.0, 155.0, 162.0), row(1.4e6, 89.0, 155.0, 162.0))
    judge("b300-tp8-bf16", [peak, bf16])
    assert bf16.checks == []  # the issue sets no line at bf16's other overloaded levels


def test_cli_prints_every_stack_and_writes_the_checks(tmp_path: Path) -> None:
    out = tmp_path / "cmp.json"
    args = ["compare", "--profile", "tiny", "--conversations", "2,4", "--seeds", "1", "--minutes", "1"]
    args += ["--warmup-minutes", "0", "--scale", "0.032", "--jobs", "1", "--json", str(out)]
    args += ["--markdown", str(tmp_path / "cmp.md")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    for name in ("gateway", "direct", "sglang-cache-aware", "ceiling", "acceptance checks pass"):
        assert name in res.output
    doc = json.loads(out.read_text())
    assert [(c["conversations"], c["seed"]) for c in doc["cells"]] == [(2, 1), (4, 1)]
    assert all(set(c["rows"]) == set(STACKS) and len(c["checks"]) == 4 for c in doc["cells"])
    table = (tmp_path / "cmp.md").read_text().splitlines()
    assert len(table) == 2 + 2 and table[2].startswith("| 2 | 1 | ")  # header, rule, one row per cell
    again = from_json(doc)  # the same verdicts from the written figures
    assert [[k.ok for k in c.checks] for c in again] == [[k["ok"] for k in c["checks"]] for c in doc["cells"]]
