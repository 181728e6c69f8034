"""The report renders: table with ratio rows, valid PNGs, HTML that references them."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

from rich.console import Console

from loadtest.results.tables import PLOTS, comparison_table, markdown_table, write_report


def _rows() -> list[dict]:
    rows = []
    for n, (g, d) in {4: (2.0e6, 1.5e6), 8: (3.9e6, 1.0e6)}.items():
        rows.append(
            {
                "system": "gateway",
                "conversations": n,
                "total_tpm": g,
                "ttft_p50_s": 0.4,
                "ttft_p95_s": 1.2,
                "completed_rpm": 12.0,
                "output_tps_p50": 40.0,
                "cache_hit_rate": 0.97,
                "max_wait_s": 2.0,
            }
        )
        rows.append(
            {
                "system": "direct",
                "conversations": n,
                "total_tpm": d,
                "ttft_p50_s": 4.0,
                "ttft_p95_s": 30.0,
                "completed_rpm": 6.0,
                "output_tps_p50": 20.0,
                "cache_hit_rate": 0.3,
                "max_wait_s": None,
            }
        )
    return rows


def _check_png(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    crc = struct.unpack(">I", data[29:33])[0]
    assert crc == zlib.crc32(data[12:29])
    assert data.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")
    return width, height


def test_table_has_rows_and_ratios() -> None:
    console = Console(width=200, record=True)
    console.print(comparison_table(_rows(), "t"))
    text = console.export_text()
    assert "direct / gateway" in text
    assert "0.26x" in text  # 1.0M / 3.9M at 8 conversations
    assert "10.00x" in text  # TTFT p50 4.0 / 0.4
    assert "3.90M" in text and "97.0%" in text
    md = markdown_table(_rows())
    assert md.count("\n") == 1 + 4 and "| 8 | direct | 1.00M |" in md


def test_report_folder(tmp_path: Path) -> None:
    index = write_report(_rows(), tmp_path / "rep", title="demo")
    folder = index.parent
    assert json.loads((folder / "report.json").read_text())["runs"][0]["system"] == "gateway"
    page = index.read_text()
    for name in PLOTS:
        w, h = _check_png(folder / name)
        assert w > 300 and h > 200
        assert f'src="{name}"' in page
    assert "<table>" in page and "gateway" in page and "http" not in page.replace("https://", "")
