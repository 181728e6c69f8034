"""The gateway's Prometheus metrics (gateway/observability/metrics.py): the series dashboards rely on,
the zero series exported from the start, the exposition format a scraper asks for (exemplars only in
OpenMetrics), and multiprocess mode: the directory, workers' files merged at a scrape, a dead worker's
live gauges reaped while its counters stay. The batched values themselves: test_metric_values.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, values
from prometheus_client.values import MultiProcessValue

from gateway.observability import metric_values
from gateway.observability.metric_values import flush
from gateway.observability.metrics import (
    MULTIPROC_ENV,
    REFUSAL_REASONS,
    UPSTREAM_ERROR_KINDS,
    Metrics,
    multiprocess_dir,
    prepare_multiprocess_dir,
    reap_dead_workers,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _series(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


@pytest.fixture()
def one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.delenv(MULTIPROC_ENV.lower(), raising=False)


def test_one_process_exposes_its_series_by_their_contract_names(one_process: None) -> None:
    m = Metrics(CollectorRegistry())
    assert m.multiprocess_dir is None and isinstance(m.ttft, metric_values.LocalHistogram)
    m.requests.labels("t", "kimi", "b1", "200").inc()
    m.http_requests.labels("POST", "/v1/chat/completions", "200").inc()
    m.ttft.labels("t", "kimi", "b1").observe(0.3)
    m.queue_wait.labels("t", "kimi").observe(0.02)
    m.inflight.labels("t").inc()
    m.redis_degraded.set(1)
    body, content_type = m.exposition()
    assert content_type.startswith("text/plain")
    series = _series(body.decode())
    assert series['cachegate_requests_total{backend="b1",model="kimi",status="200",team="t"}'] == 1
    assert series['cachegate_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}'] == 1
    assert series['cachegate_ttft_seconds_bucket{backend="b1",le="0.4",model="kimi",team="t"}'] == 1
    assert series['cachegate_ttft_seconds_bucket{backend="b1",le="0.2",model="kimi",team="t"}'] == 0
    assert series['cachegate_queue_wait_seconds_count{model="kimi",team="t"}'] == 1
    assert series['cachegate_inflight_requests{team="t"}'] == 1
    assert series["cachegate_redis_degraded"] == 1


def test_refusal_and_upstream_error_series_exist_at_zero_from_the_start(one_process: None) -> None:
    m = Metrics(CollectorRegistry())
    m.init_labels(["a", "b"], ["b1"])
    series = _series(m.exposition()[0].decode())
    refusals = {k: v for k, v in series.items() if k.startswith("cachegate_admission_refusals_total")}
    errors = {k: v for k, v in series.items() if k.startswith("cachegate_upstream_errors_total")}
    assert len(refusals) == 2 * len(REFUSAL_REASONS) and set(refusals.values()) == {0.0}
    assert 'cachegate_admission_refusals_total{reason="queue_timeout",team="b"}' in refusals
    assert set(errors) == {f'cachegate_upstream_errors_total{{backend="b1",kind="{k}"}}' for k in UPSTREAM_ERROR_KINDS}


def test_exemplars_only_in_openmetrics(one_process: None) -> None:
    m = Metrics(CollectorRegistry())
    m.ttft.labels("t", "kimi", "b1").observe(0.3, {"trace_id": TRACE})
    classic, _ = m.exposition("text/plain")
    om, content_type = m.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and om.endswith(b"# EOF\n")
    assert TRACE.encode() not in classic
    (line,) = [ln for ln in om.decode().splitlines() if TRACE in ln]
    assert line.startswith('cachegate_ttft_seconds_bucket{backend="b1",le="0.4",model="kimi",team="t"} 1.0 # ')


def test_a_scrape_reads_updates_still_batched(one_process: None) -> None:
    m = Metrics(CollectorRegistry())
    m.tokens.labels("t", "kimi", "output").inc(42)
    assert metric_values._PENDING, "batched"
    assert m.exposed.get_sample_value("cachegate_tokens_total", {"team": "t", "model": "kimi", "kind": "output"}) == 42


def test_the_multiprocess_directory_is_named_by_either_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.setenv(MULTIPROC_ENV.lower(), "/tmp/lower")
    assert multiprocess_dir() == "/tmp/lower"
    monkeypatch.setenv(MULTIPROC_ENV, "/tmp/upper")
    assert multiprocess_dir() == "/tmp/upper"
    monkeypatch.setenv(MULTIPROC_ENV, "")
    monkeypatch.setenv(MULTIPROC_ENV.lower(), "")
    assert multiprocess_dir() is None


def test_prepare_empties_a_given_directory_of_the_last_runs_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    given = tmp_path / "metrics"
    monkeypatch.setenv(MULTIPROC_ENV, str(given))
    assert prepare_multiprocess_dir() == str(given) and given.is_dir(), "made when missing"
    (given / "counter_123.db").write_bytes(b"x")
    (given / "notes.txt").write_text("kept")
    assert prepare_multiprocess_dir() == str(given)
    assert sorted(p.name for p in given.iterdir()) == ["notes.txt"]


def test_prepare_makes_a_fresh_directory_and_names_it_for_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, "")  # unset for the code; restored (absent) after the test
    path = prepare_multiprocess_dir()
    try:
        assert os.environ[MULTIPROC_ENV] == path and Path(path).is_dir() and not any(Path(path).iterdir())
        assert Path(path).name.startswith("cachegate-metrics-")
    finally:
        Path(path).rmdir()


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _worker(monkeypatch: pytest.MonkeyPatch, pid: int) -> Metrics:
    """A worker's metrics in multiprocess mode (its values in files named by ``pid``, as prometheus-client
    makes them when ``PROMETHEUS_MULTIPROC_DIR`` is set before its import), updated once."""
    monkeypatch.setattr(values, "ValueClass", MultiProcessValue(lambda: pid))  # read as each series is made
    m = Metrics(CollectorRegistry())
    m.requests.labels("t", "kimi", "b1", "200").inc()
    m.inflight.labels("t").inc(2)
    m.ttft.labels("t", "kimi", "b1").observe(0.3, {"trace_id": TRACE})
    return m


def test_a_scrape_merges_every_workers_files_and_reaps_the_dead(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    dead = _dead_pid()
    alive = _worker(monkeypatch, os.getpid())
    gone = _worker(monkeypatch, dead)
    assert not isinstance(alive.ttft, metric_values.LocalHistogram), "prometheus-client's, in the shared files"
    flush()
    live_files = sorted(p.name for p in tmp_path.glob("gauge_live*"))
    assert f"gauge_livesum_{dead}.db" in live_files
    body, _ = alive.exposition("application/openmetrics-text")
    series = _series(body.decode().replace("# EOF", ""))
    assert series['cachegate_requests_total{backend="b1",model="kimi",status="200",team="t"}'] == 2, "summed"
    assert series['cachegate_inflight_requests{team="t"}'] == 2, "the dead worker's live gauge is not counted"
    assert series['cachegate_ttft_seconds_count{backend="b1",model="kimi",team="t"}'] == 2
    assert TRACE.encode() not in body, "no exemplars across processes"
    assert not list(tmp_path.glob(f"gauge_live*_{dead}.db")) and list(tmp_path.glob(f"counter_{dead}.db"))
    assert reap_dead_workers(str(tmp_path)) == [], "reaped already"
    alive.close()  # this worker shutting down: its live gauges stop counting, its counters stay
    assert not list(tmp_path.glob(f"gauge_live*_{os.getpid()}.db"))
    series = _series(gone.exposition()[0].decode())
    assert series['cachegate_requests_total{backend="b1",model="kimi",status="200",team="t"}'] == 2
    assert 'cachegate_inflight_requests{team="t"}' not in series


def test_reap_returns_the_dead_pids_and_leaves_the_living(tmp_path: Path) -> None:
    dead = _dead_pid()
    for name in (f"gauge_livesum_{dead}.db", f"gauge_livemax_{dead}.db", f"gauge_livesum_{os.getpid()}.db"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / f"counter_{dead}.db").write_bytes(b"")
    assert reap_dead_workers(str(tmp_path)) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_{dead}.db", f"gauge_livesum_{os.getpid()}.db"]
    )
    assert reap_dead_workers(str(tmp_path / "missing")) == [], "no directory: nothing to reap"
