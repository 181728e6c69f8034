"""Waiting is visible: while a request waits in admission, ``/admin/state`` shows its team's oldest and
expected wait beside the team's bound, and ``/metrics`` the same as gauges (a real gateway process in front
of a simulated SGLang twin, the official ``openai`` SDK as the client)."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from backends.sim.testing import run_twin
from tests.harness import run_gateway

MODEL = "moonshotai/Kimi-K2-Instruct"
KEY, ADMIN = "sk-waits", "admin-secret"


@pytest.fixture()
def twin() -> Iterator[str]:
    with run_twin("tiny", time_scale=1.0, model=MODEL) as url:
        yield url


def gauge(text: str, name: str, team: str) -> float | None:
    m = re.search(rf'^{name}{{team="{team}"}} ([0-9.e+-]+)$', text, re.M)
    return float(m.group(1)) if m else None


@pytest.mark.slow  # > 5 s here (a gateway process, two streamed answers one after the other)
def test_a_waiting_request_shows_in_admin_state_and_metrics(twin: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "models": {"kimi": {"upstream_model": MODEL, "backends": [{"url": twin}]}},
                "teams": {"waits": {"max_concurrency": 1, "max_queue": 10, "queue_timeout_s": 60, "max_wait_s": 120}},
                "keys": [{"sha256": hashlib.sha256(KEY.encode()).hexdigest(), "team": "waits"}],
                "health": {"interval_s": 0.5, "load_interval_s": 0.2},
                "workers": 1,
            }
        )
    )
    with run_gateway("--config", str(cfg), "--admin-token", ADMIN) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)
        done: list[str] = []

        def ask(n: int) -> None:
            stream = client.chat.completions.create(
                model="kimi",
                stream=True,
                max_tokens=400,
                messages=[{"role": "user", "content": f"request {n}: " + "y" * 500}],
            )
            done.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))

        threads = [threading.Thread(target=ask, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.2)  # the first holds the team's one slot; the second waits
        auth = {"authorization": f"Bearer {ADMIN}"}
        seen: dict | None = None
        metric: float | None = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (seen is None or metric is None):
            team = httpx.get(base + "/admin/state", headers=auth).json()["core"]["teams"].get("waits", {})
            if team.get("waiting", 0) >= 1 and team.get("oldest_wait_s", 0) > 0:
                seen = team
            text = httpx.get(base + "/metrics").text
            value = gauge(text, "cachegate_oldest_wait_seconds", "waits")
            if value:
                metric = value
                assert gauge(text, "cachegate_wait_bound_seconds", "waits") == 120.0
                assert gauge(text, "cachegate_expected_wait_seconds", "waits") is not None
            time.sleep(0.1)
        for t in threads:
            t.join(60)
        assert seen is not None, "no waiter showed in /admin/state"
        assert seen["max_wait_s"] == 120.0 and 0 < seen["expected_wait_s"] <= 120.0
        assert metric is not None and metric > 0
        assert len(done) == 2 and all(done)  # the waiter was served in the end
