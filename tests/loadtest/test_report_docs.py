"""`python -m loadtest.docs`: tables and shape checks from runs, and it keeps others' sections."""

from __future__ import annotations

from pathlib import Path

from loadtest.docs import LEVELS, PROFILES, shape_checks, write_docs


def _rows(bf16: dict[int, float]) -> list[dict]:
    rows = []
    for p in PROFILES:
        for n in LEVELS:
            tpm = bf16[n] if p == "b300-tp8-bf16" else 1e6 * n / 8
            rows.append(
                {
                    "profile": p,
                    "conversations": n,
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
    assert "python -m loadtest.docs" in cal
