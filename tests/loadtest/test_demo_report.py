"""The demo's verdict and report: checks that can fail, plots that open, a page that needs no network."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.demo.fullscale import published
from loadtest.demo.report import meaning, verdict, write_demo_report
from tests.loadtest.test_report import _check_png


def _live() -> list[dict]:
    rows = []
    for n, (d, g, dp, gp) in {
        4: (600e3, 650e3, 0.1, 0.07),
        8: (640e3, 1.1e6, 0.2, 0.08),
        16: (300e3, 1.5e6, 5.0, 0.1),
        32: (140e3, 1.45e6, 14.0, 0.12),
    }.items():
        for system, tpm, p50 in (("direct", d, dp), ("gateway", g, gp)):
            rows.append(
                {
                    "system": system,
                    "conversations": n,
                    "total_tpm": tpm,
                    "ttft_p50_s": p50,
                    "ttft_p95_s": p50 * 4,
                    "completed_rpm": 100.0,
                    "output_tps_p50": 40.0,
                    "cache_hit_rate": 0.9 if system == "gateway" else 0.3,
                    "max_wait_s": 20.0,
                }
            )
    return rows


def _fullscale() -> dict:
    runs = []
    for prof in ("b300-tp8-bf16", "b300-tp8-fp8-hicache"):
        for pol in ("direct", "gateway"):
            for n in (8, 16, 32, 48, 64):
                collapsed = prof == "b300-tp8-bf16" and pol == "direct" and n >= 32
                runs.append(
                    {
                        "profile": prof,
                        "policy": pol,
                        "conversations": n,
                        "total_tpm": 1.2e6 if collapsed else 4.5e6,
                        "ttft_p50_s": 50.0 if collapsed else 0.3,
                        "ttft_p95_s": 90.0 if collapsed else 2.0,
                        "cache_hit_rate": 0.97,
                    }
                )
    return {
        "bad_profile": "b300-tp8-bf16",
        "good_profile": "b300-tp8-fp8-hicache",
        "good_is_fallback": True,
        "minutes": 20,
        "warmup_minutes": 5,
        "seed": 1,
        "wall_s": 3.0,
        "cpu_s": 5.0,
        "runs": runs,
        "published": {"bad": published("bad"), "good": published("good")},
        "command": "cachegate simulate ...",
    }


def test_verdict_reads_the_top_level_against_each_peak() -> None:
    v = verdict(_live())
    assert v is not None and v["conversations"] == 32
    assert v["direct"]["of_peak"] == round(140e3 / 640e3, 3) and v["gateway"]["of_peak"] == round(1.45e6 / 1.5e6, 3)
    assert v["checks"] == {
        "direct_at_most_half_of_peak": True,
        "gateway_keeps_85pct_of_peak": True,
        "gateway_ttft_p50_at_most_a_fifth": True,
    }
    assert "32 conversations" in v["sentence"] and "10.4x" in v["sentence"] and "14.00 s" in v["sentence"]
    rows = [dict(r, total_tpm=1.0e6) if r["system"] == "gateway" and r["conversations"] == 32 else r for r in _live()]
    assert verdict(rows)["checks"]["gateway_keeps_85pct_of_peak"] is False  # 1.0M of a 1.5M peak
    assert verdict([r for r in _live() if r["system"] == "direct"]) is None


def test_report_page_plots_and_meaning(tmp_path: Path) -> None:
    index = write_demo_report(_live(), tmp_path / "rep", "demo", meta={"wall_s": 140.0}, fullscale=_fullscale())
    folder = index.parent
    page = index.read_text()
    for name in ("live.png", "fullscale-bf16.png", "fullscale-good.png", "tpm.png", "ttft.png", "cache_hit.png"):
        w, h = _check_png(folder / name)
        assert w > 500 and h > 300
        assert f'href="{name}"' in page or f'src="{name}"' in page
    assert "http://" not in page and "https://" not in page and "<script" not in page  # opens offline
    assert "PASS" in page and "b300-dp8-fp8-cp" in page  # the fallback is said
    data = json.loads((folder / "report.json").read_text())
    assert data["verdict"]["conversations"] == 32 and len(data["fullscale"]["runs"]) == 20
    text = meaning(data["verdict"], data["fullscale"])
    assert "22%" in text and "97%" in text  # direct's and gateway's share of their peaks, from the numbers
    assert "1.20M" in text and "3.8x" in text  # bf16 direct at 48, gateway over direct


def test_fullscale_figures_are_reused_only_for_the_same_code_and_runs(tmp_path: Path) -> None:
    import orjson

    from loadtest.demo.fullscale import FullScale, code_key

    cache = tmp_path / "fullscale-cache.json"
    probe = FullScale(minutes=1, levels=(8,), jobs=1, cache=cache)  # no cache yet: it simulates
    assert probe.cached is None
    first = probe.result()
    assert len(first["runs"]) == 4 and cache.is_file()
    again = FullScale(minutes=1.0, levels=(8,), jobs=1, cache=cache)
    assert again.cached is not None and again.done() == 4 and again.result()["cached"] is True
    data = orjson.loads(cache.read_bytes())
    cache.write_bytes(orjson.dumps({**data, "key": code_key(["other code"])}))
    stale = FullScale(minutes=1, levels=(8,), jobs=1, cache=cache)
    assert stale.cached is None
    stale.cancel()
