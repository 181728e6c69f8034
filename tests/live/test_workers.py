"""``cachegate serve --workers 2``: metrics in prometheus-client multiprocess mode add up over the
workers, whichever worker answers the scrape (each worker's counts within ``Metrics.FLUSH_S``), and
survive a worker that dies."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from backends.sim.server import DEFAULT_MODEL
from backends.sim.testing import run_twin
from gateway.observability.metrics import Metrics
from tests.conftest import _need_redis
from tests.harness import run_gateway

REDIS_URL = os.environ.get("CACHEGATE_TEST_REDIS_WORKERS", "redis://127.0.0.1:6379/11")  # this file's own DB
N = 24
ROUNDS_S = 30.0  # how long to keep sending rounds for both workers to serve
STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) cachegate[.\w]*: ")
OPENMETRICS = "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.fixture()
def workers_redis() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        _need_redis(f"Redis at {REDIS_URL} is unreachable: {exc}")
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


def _requests_total(body: str, openmetrics: bool) -> float:
    families = parse_openmetrics(body) if openmetrics else parse_text(body)
    for family in families:
        if family.name == "cachegate_requests":
            return sum(s.value for s in family.samples if s.name == "cachegate_requests_total")
    return 0.0


def _gauge(body: str, name: str) -> float:
    return sum(s.value for f in parse_text(body) for s in f.samples if s.name == name)


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            # uvicorn's workers, not multiprocessing's resource tracker
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
                kids.append(int(entry.name))
    return kids


@pytest.mark.redis
@pytest.mark.slow
def test_two_workers_count_every_request(workers_redis: str, tmp_path: Path) -> None:
    mpdir = tmp_path / "metrics"
    (mpdir).mkdir()
    (mpdir / "counter_1.db").write_bytes(b"stale")  # a previous run's file: must be wiped at start
    cfg = tmp_path / "c.yaml"
    with run_twin("tiny", time_scale=0.02) as twin:
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"upstream_model": DEFAULT_MODEL, "backends": [{"url": twin}]}},
                    "health": {"interval_s": 0.2, "load_interval_s": 0.2},
                    "teams": {"default": {"max_concurrency": 16, "max_queue": 64}},
                }
            )
        )
        env = {"PROMETHEUS_MULTIPROC_DIR": str(mpdir)}
        with run_gateway("--config", str(cfg), "--workers", "2", "--redis-url", workers_redis, env=env) as base:
            body = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

            def one(i: int) -> int:
                # A fresh connection each time, so either worker may accept it.
                return httpx.post(base + "/v1/chat/completions", json=body, timeout=30).status_code

            def writers() -> set[str]:
                return {p.stem.rsplit("_", 1)[1] for p in mpdir.glob("counter_*.db")}

            # Both workers accept from one listening socket and the kernel gives each connection to
            # whichever is waiting first (the second may still be starting), so a round may land on one
            # worker alone: send rounds until both have served (for at most ROUNDS_S), then check that
            # the totals cover all that was sent.
            sent = 0
            with ThreadPoolExecutor(6) as pool:
                deadline = time.monotonic() + ROUNDS_S
                while True:
                    statuses = list(pool.map(one, range(N)))
                    assert statuses == [200] * N
                    sent += N
                    if len(writers()) >= 2 or time.monotonic() > deadline:
                        break
            assert "1" not in writers(), "the stale file of an earlier run was not removed"
            assert len(writers()) >= 2, f"only {writers()} wrote counters in {sent} requests: both workers must serve"

            # Each worker pushes its counts to its file within Metrics.FLUSH_S (the one answering, at
            # once): wait that long for the totals, then every scrape, in either format, has them all.
            deadline = time.monotonic() + 10 * Metrics.FLUSH_S
            while _requests_total(httpx.get(base + "/metrics").text, False) < sent and time.monotonic() < deadline:
                time.sleep(Metrics.FLUSH_S / 4)
            for i in range(6):
                om = i % 2 == 0
                r = httpx.get(base + "/metrics", headers={"accept": OPENMETRICS if om else "text/plain"})
                assert r.headers["content-type"].startswith("application/openmetrics-text" if om else "text/plain")
                assert _requests_total(r.text, om) == sent, f"scrape {i}: totals must cover every worker"
                assert _gauge(r.text, "cachegate_inflight_requests") == 0

            # A worker that dies: uvicorn starts another; its counts stay in the totals.
            workers = _children(base.pid)
            assert len(workers) >= 2
            os.kill(workers[0], signal.SIGKILL)
            deadline = time.monotonic() + 20
            while len([p for p in _children(base.pid) if p != workers[0]]) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            for _ in range(4):
                r = httpx.get(base + "/metrics")
                assert _requests_total(r.text, False) == sent
            # Each worker logs in the parent's layout (time, level, logger), not bare messages.
            warned = [ln for ln in base.output().splitlines() if "no API keys configured" in ln]
            assert len(warned) >= 2 and all(STAMPED.match(ln) for ln in warned), warned
            access = [ln for ln in base.output().splitlines() if "cachegate.access: POST /v1/chat/completions" in ln]
            assert len(access) == sent and all(STAMPED.match(ln) for ln in access)
