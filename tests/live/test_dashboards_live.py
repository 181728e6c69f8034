"""Issue 7 acceptance: every dashboard panel's PromQL returns data from a real Prometheus.

A real Prometheus (exemplar storage on, OpenMetrics negotiated) scrapes the gateway (tracing on, one
worker, so exemplars) and three simulated SGLang twins during a short load that has everything a
panel shows: streamed answers with prefix reuse, refusals (a team with one seat, no queue and a
token rate), requests the engine rejects (past its context length), and a backend killed mid-run
(connect errors, breaker open). Then every expression of ``deploy.grafana.generate.all_queries()``
goes through the HTTP API.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.server import DEFAULT_MODEL
from backends.sim.testing import run_twin
from deploy.grafana.generate import all_queries
from tests.gateway.observability.test_telemetry import OtlpReceiver
from tests.harness import run_gateway
from tests.promharness import prometheus

KEYS = {"default": "sk-live-default", "tight": "sk-live-tight"}
LOAD_S = 9.0
KILL_AT_S = 3.5


def _config(path: Path, twins: list[str]) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "kimi": {
                        "upstream_model": DEFAULT_MODEL,
                        "backends": [{"url": u, "name": f"twin-{i}"} for i, u in enumerate(twins)],
                    }
                },
                # A long health interval: the killed backend is found by the requests sent to it (connect errors).
                "health": {"interval_s": 30, "load_interval_s": 0.25},
                "teams": {
                    "default": {"max_concurrency": 8, "max_queue": 32},
                    "tight": {"max_concurrency": 1, "max_queue": 0, "tokens_per_minute": 3000},
                },
                "keys": [{"sha256": hashlib.sha256(k.encode()).hexdigest(), "team": t} for t, k in KEYS.items()],
            }
        )
    )
    return str(path)


class Load:
    """Background clients; counts what they sent and got."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.lock = threading.Lock()

    def _post(self, team: str, body: dict[str, Any]) -> None:
        headers = {"authorization": f"Bearer {KEYS[team]}"}
        try:
            if body.get("stream"):
                with httpx.stream(
                    "POST", self.base + "/v1/chat/completions", json=body, headers=headers, timeout=30
                ) as r:
                    r.read()
                    status = r.status_code
            else:
                status = httpx.post(
                    self.base + "/v1/chat/completions", json=body, headers=headers, timeout=30
                ).status_code
        except httpx.HTTPError:
            status = -1
        with self.lock:
            self.statuses.append(status)

    def conversations(self, worker: int) -> None:
        """Multi-turn chats: each turn resends the growing history, so the engines' caches hit."""
        history = [{"role": "system", "content": f"You are agent {worker}. " + "Rules of the house. " * 60}]
        turn = 0
        while not self.stop.is_set():
            history.append({"role": "user", "content": f"Step {turn} of task {worker}: " + "details " * 40})
            self._post("default", {"model": "kimi", "messages": history, "max_tokens": 24, "stream": True})
            history.append({"role": "assistant", "content": "done " * 20})
            turn += 1

    def tight_team(self) -> None:
        """Bursts of three from a team with one seat and no queue: refusals, then its token rate."""
        while not self.stop.is_set():
            body = {"model": "kimi", "messages": [{"role": "user", "content": "quick " * 200}], "max_tokens": 40}
            threads = [threading.Thread(target=self._post, args=("tight", body)) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.stop.wait(0.3)

    def rejected(self) -> None:
        """Requests the engine refuses (prompt plus max_tokens past its context length): a 400 upstream."""
        while not self.stop.wait(0.7):
            self._post(
                "default", {"model": "kimi", "messages": [{"role": "user", "content": "x"}], "max_tokens": 300_000}
            )

    def scatter(self) -> None:
        """Fresh prompts (no shared prefix), spread over every backend, the dead one included."""
        i = 0
        while not self.stop.wait(0.15):
            self._post(
                "default",
                {"model": "kimi", "messages": [{"role": "user", "content": f"new topic {i} " * 30}], "max_tokens": 8},
            )
            i += 1


def _gateway_metrics(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(httpx.get(base + "/metrics").text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


@pytest.mark.slow
def test_every_dashboard_query_returns_data(tmp_path: Path) -> None:
    queries = all_queries()
    assert queries and not [q for q in queries if "vector(0)" in q[2]], "no padding with or vector(0)"
    with contextlib.ExitStack() as stack:
        receiver = stack.enter_context(OtlpReceiver().running())
        stable = [stack.enter_context(run_twin("tiny", time_scale=0.02, abort_delay_s=0.2)) for _ in range(2)]
        doomed = contextlib.ExitStack()
        stack.enter_context(doomed)
        victim = doomed.enter_context(run_twin("tiny", time_scale=0.02, abort_delay_s=0.2))
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        base = stack.enter_context(run_gateway("--config", _config(tmp_path / "c.yaml", [*stable, victim]), env=env))
        hostport = lambda url: url.split("://", 1)[1]  # noqa: E731
        prom = stack.enter_context(
            prometheus({"cachegate": [hostport(base)], "sglang": [hostport(u) for u in (*stable, victim)]})
        )
        prom.wait_for("count(up == 1) >= 4", timeout=20)

        start = time.time()
        load = Load(base)
        workers = [threading.Thread(target=load.conversations, args=(w,)) for w in range(3)]
        workers += [threading.Thread(target=f) for f in (load.tight_team, load.rejected, load.scatter)]
        for w in workers:
            w.start()
        try:
            time.sleep(KILL_AT_S)
            doomed.close()  # the victim backend goes away mid-run
            time.sleep(LOAD_S - KILL_AT_S)
        finally:
            load.stop.set()
            for w in workers:
                w.join(30)
        sent = len(load.statuses)
        assert {200, 400, 429} <= set(load.statuses), sorted(set(load.statuses))

        # Prometheus has scraped the end of the run once it counts every answer.
        prom.wait_for(
            "sum(cachegate_requests_total)", timeout=10, predicate=lambda r: bool(r) and float(r[0]["value"][1]) >= sent
        )

        empty, nan = [], []
        for uid, title, expr in queries:
            rows = prom.query(expr)
            if not rows:
                empty.append((uid, title, expr))
            elif all(math.isnan(float(r["value"][1])) for r in rows):
                nan.append((uid, title, expr))
        assert not empty, "panels without data:\n" + "\n".join(map(str, empty))
        assert not nan, "panels with only NaN:\n" + "\n".join(map(str, nan))

        # The run had what the panels are meant to show.
        assert prom.values('max(cachegate_backend_healthy{backend="twin-2"})') == {(): 0.0}
        # Open (2) after the connect error; by now it may have gone half-open (1) to probe again.
        assert prom.values('max(max_over_time(cachegate_backend_breaker_state{backend="twin-2"}[1m]))') == {(): 2.0}
        assert prom.values('max(cachegate_backend_breaker_state{backend="twin-2"})')[()] >= 1
        connect = prom.values('sum(cachegate_upstream_errors_total{backend="twin-2",kind="connect"})')
        assert connect[()] >= 1
        reasons = {
            dict(k)["reason"]
            for k, v in prom.values("sum by (reason) (cachegate_admission_refusals_total)").items()
            if v > 0
        }
        assert "team_queue_full" in reasons, reasons
        assert prom.values('sum(cachegate_tokens_total{kind="cached"})')[()] > 0

        # Exemplars: the TTFT histogram's carry trace ids the collector received.
        exemplars = [
            e
            for series in prom.query_exemplars("cachegate_ttft_seconds_bucket", start - 5, time.time() + 5)
            for e in series["exemplars"]
        ]
        assert exemplars, "no TTFT exemplars stored"
        ids = {e["labels"]["trace_id"] for e in exemplars}
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
        received = receiver.wait(lambda spans: ids & {s["trace_id"] for s in spans if s["kind"] == 2})
        assert received, "an exemplar's trace id must lead to an exported trace"

        # Each dispatch is counted once: the final one per answered request plus one per retry.
        m = _gateway_metrics(base)
        routed = sum(m["cachegate_route_decisions_total"].values())
        dispatched = sum(v for k, v in m["cachegate_requests_total"].items() if dict(k)["backend"])
        retries = sum(v for k, v in m["cachegate_upstream_errors_total"].items() if dict(k)["kind"] == "connect")
        assert routed == dispatched + retries, (routed, dispatched, retries)
