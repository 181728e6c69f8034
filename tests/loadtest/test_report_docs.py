"""`python -m loadtest.docs.sim_tables`: tables and shape checks from runs, and it keeps others' sections."""

from __future__ import annotations

from pathlib import Path

from loadtest.docs.sim_tables import COLLAPSING, LEVELS, PROFILES, collapse_check, shape_checks, write_docs


def _rows(bf16: dict[int, float], steady: dict[int, float] | None = None) -> list[dict]:
    rows = []
    runs = [(p, False) for p in PROFILES] + [(p, True) for p in COLLAPSING]
    for p, warm in runs:
        for n in LEVELS:
            fresh = bf16[n] if p == "b300-tp8-bf16" else 1e6 * n / 8
            tpm = (steady or bf16)[n] if warm else fresh
            rows.append(
                {
                    "profile": p,
                    "conversations": n,
                    "warm_start": warm,
                    "total_tpm": tpm,
                    "input_tpm": tpm * 0.99,
                    "ttft_p50_s": 0.3,
                    "ttft_p95_s": 2.0,
                    "completed_rpm": 20.0,
                    "output_tps_p50": 30.0,
                    "cache_hit_rate": 0.9,
                    "max_wait_s": 3.0,
                    "starved": 0,
                    "retractions": 0,
                }
            )
    return rows


def test_shape_checks_fail_and_pass() -> None:
    collapse = _rows({8: 3e6, 16: 4.5e6, 32: 1.2e6, 48: 1.1e6, 64: 1e6})
    assert [ok for _, ok, _ in shape_checks(collapse)] == [True, True]
    no_collapse = _rows({8: 3e6, 16: 4.5e6, 32: 2e6, 48: 1.1e6, 64: 1e6})
    assert [ok for _, ok, _ in shape_checks(no_collapse)] == [False, True]


def test_docs_written_and_other_sections_kept(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n## Admission\nhand-written\n")
    rows = _rows({8: 3e6, 16: 4.5e6, 32: 1.2e6, 48: 1.1e6, 64: 1e6})
    write_docs(rows, None, 20, 5, tmp_path)
    write_docs(rows, None, 20, 5, tmp_path)  # twice: the section is replaced, not appended
    bench = (tmp_path / "benchmarks.md").read_text()
    assert "hand-written" in bench and bench.count("## Simulated: the collapse") == 1
    assert "| 16 | 4.50M | 5.66M |" in bench and "PASS: bf16 collapses" in bench
    cal = (tmp_path / "calibration.md").read_text()
    assert "| b300-dp8-fp8 (good) | 48 | 6.00M | 20.23M | 0.30 |" in cal
    assert "python -m loadtest.docs.sim_tables" in cal
    assert "--warm-start" in cal  # the steady-state commands are listed


def test_collapse_line_reads_the_steady_state_runs() -> None:
    # The calibration-protocol rows of b300-tp4-fp8 rise with the load (1e6 × n / 8): no collapse there;
    # the steady-state rows collapse, and the acceptance line reads those.
    steady = {8: 4e6, 16: 5.5e6, 32: 0.9e6, 48: 1.0e6, 64: 0.9e6}
    rows = _rows({8: 3e6, 16: 4.5e6, 32: 1.2e6, 48: 1.1e6, 64: 1e6}, steady)
    ratio, collapse, _ = collapse_check(rows, "b300-tp4-fp8")
    assert ratio == 1.0e6 / 5.5e6 and collapse
    fresh, fresh_collapse, _ = collapse_check(rows, "b300-tp4-fp8", steady=False)
    assert fresh == 6e6 / 8e6 and not fresh_collapse
    # Medians of 0.3 s are not within 2× of the published 2.40 / 3.09 s.
    assert collapse_check(rows, "b300-tp4-fp8")[2] is False
