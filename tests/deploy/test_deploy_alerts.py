"""deploy/prometheus/alerts.yml: a real Prometheus loads the rules and ``CachegateWaitPastBound`` fires for
the team whose oldest wait passed its bound, from the gateway's own gauges served over loopback HTTP."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gateway.observability.metrics import Metrics
from tests.promharness import prometheus

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def test_rules_are_wired_into_the_compose_prometheus() -> None:
    deploy = RULES.parent.parent
    assert "alerts.yml" in yaml.safe_load((deploy / "prometheus" / "prometheus.yml").read_text())["rule_files"]
    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in (deploy / "compose.yaml").read_text()


@pytest.fixture
def gauges() -> Iterator[tuple[Metrics, str]]:
    """The gateway's Metrics served at /metrics on a free loopback port."""
    metrics = Metrics()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, ctype = metrics.exposition(self.headers.get("Accept", ""))
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield metrics, f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_wait_past_bound_fires_only_for_the_team_past_it(gauges: tuple[Metrics, str]) -> None:
    metrics, target = gauges
    for team, oldest, bound in (("late", 300.0, 240.0), ("fine", 30.0, 240.0)):
        metrics.oldest_wait.labels(team).set(oldest)
        metrics.expected_wait.labels(team).set(oldest / 2)
        metrics.wait_bound.labels(team).set(bound)
    rules = RULES.read_text().replace("for: 30s", "for: 0s")  # the same rule, without the hold time
    assert rules != RULES.read_text()
    with prometheus({"cachegate": [target]}, rules=rules) as prom:
        deadline = time.monotonic() + 30
        alerts: list[dict] = []
        while time.monotonic() < deadline:
            alerts = [a for a in prom.alerts() if a["labels"]["alertname"] == "CachegateWaitPastBound"]
            if any(a["state"] == "firing" for a in alerts):
                break
            time.sleep(0.5)
        assert [a["labels"]["team"] for a in alerts if a["state"] == "firing"] == ["late"]
        assert alerts[0]["labels"]["severity"] == "page"
