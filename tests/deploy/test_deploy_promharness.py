"""The Prometheus harness against a real `prometheus` binary scraping a real metrics endpoint."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from backends.sim.testing import run_twin
from tests.promharness import prometheus, scrape_config


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def metrics_server(registry: CollectorRegistry) -> Iterator[str]:
    """prometheus_client's HTTP exposition (OpenMetrics when asked, so exemplars go out) on loopback."""
    port = _free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_scrape_config_shape() -> None:
    cfg = scrape_config({"gw": ["a:1", "b:2"], "sim": ["c:3"]}, "1s")
    assert cfg["global"]["scrape_interval"] == "1s"
    assert [(j["job_name"], j["static_configs"][0]["targets"]) for j in cfg["scrape_configs"]] == [
        ("gw", ["a:1", "b:2"]),
        ("sim", ["c:3"]),
    ]
    assert scrape_config(["x:9"])["scrape_configs"][0]["job_name"] == "targets"


@pytest.mark.slow
def test_prometheus_scrapes_twin_counter_histogram_and_exemplars() -> None:
    """One Prometheus scrapes a simulated SGLang, a prometheus_client endpoint and a dead target."""
    registry = CollectorRegistry()
    requests = Counter("demo_requests", "requests", ["team"], registry=registry)
    ttft = Histogram("demo_ttft_seconds", "ttft", ["team"], buckets=(0.1, 0.5, 1.0, 5.0), registry=registry)
    sent = {"alpha": 7, "beta": 3}
    trace_ids = {f"{i:032x}" for i in range(1, 4)}
    for team, n in sent.items():
        requests.labels(team).inc(n)
    for i, trace_id in enumerate(sorted(trace_ids)):
        ttft.labels("alpha").observe((0.05, 0.3, 0.8)[i], exemplar={"trace_id": trace_id})  # one bucket each

    dead = f"127.0.0.1:{_free_port()}"  # nothing listens here
    start = time.time() - 1
    with (
        run_twin("tiny", time_scale=0.05) as twin_url,
        metrics_server(registry) as target,
        prometheus({"demo": [target], "dead": [dead], "sglang": [twin_url.split("//", 1)[1]]}) as prom,
    ):
        prompt_tokens = 0
        for i in range(3):
            r = httpx.post(
                f"{twin_url}/v1/chat/completions",
                timeout=30,
                json={"model": "kimi", "max_tokens": 4, "messages": [{"role": "user", "content": f"hello {i} " * 20}]},
            )
            r.raise_for_status()
            prompt_tokens += r.json()["usage"]["prompt_tokens"]
        prom.wait_for("sum(sglang:num_requests_total) == 3")
        assert prom.values("sum(sglang:prompt_tokens_total)") == {(): float(prompt_tokens)}
        usage = prom.query("sglang:token_usage")
        assert usage and all(s["metric"]["job"] == "sglang" and s["metric"]["model_name"] for s in usage)
        prom.wait_for("demo_requests_total", predicate=lambda r: len(r) == len(sent))
        got = {s["metric"]["team"]: float(s["value"][1]) for s in prom.query("demo_requests_total")}
        assert got == {team: float(n) for team, n in sent.items()}
        prom.wait_for("up", predicate=lambda r: len(r) == 3)
        assert {s["metric"]["job"]: s["value"][1] for s in prom.query("up")} == {
            "demo": "1",
            "dead": "0",
            "sglang": "1",
        }
        count = prom.query('sum(demo_ttft_seconds_count{team="alpha"})')
        assert float(count[0]["value"][1]) == len(trace_ids)
        series = prom.query_exemplars("demo_ttft_seconds_bucket", start, time.time() + 1)
        seen = {e["labels"]["trace_id"] for s in series for e in s["exemplars"]}
        assert seen == trace_ids
        with pytest.raises(TimeoutError, match="connection refused"):  # says which target is down
            prom.wait_for("no_such_metric", timeout=1.0)
        workdir = prom.log.parent
        url, proc = prom.url, prom.proc
    # Always stopped and cleaned up.
    assert proc.poll() is not None
    assert not Path(workdir).exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/-/ready", timeout=1.0)
