"""An ``engine: openai`` endpoint with its credential in ``api_key_env``: the key reaches the upstream
(every request, health checks included) and appears nowhere else: not in the gateway's output at
debug level (logs and access log), not on ``/metrics``, not in the traces it exports, not in an error
body. The backend's own served-model name is what the upstream sees."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.fake_upstream import SERVED, FakeUpstream
from tests.gateway.observability.test_telemetry import OtlpReceiver
from tests.harness import run_gateway

SECRET = "sk-upstream-7f3c9e1d5b2a4c6e8f0a1b3c5d7e9f2a"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver().running() as r:
        yield r


def test_the_upstream_key_reaches_the_upstream_and_nowhere_else(tmp_path: Path, receiver: OtlpReceiver) -> None:
    fake = FakeUpstream()
    with fake.running():
        cfg = tmp_path / "c.yaml"
        backend = {"url": fake.url, "name": "hosted", "engine": "openai", "api_key_env": "HOSTED_KEY",
                   "upstream_model": SERVED}  # fmt: skip
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"upstream_model": "not-this-name", "backends": [backend]}},
                    "log_level": "debug",
                    "access_log": "json",
                    "telemetry": {"otlp_endpoint": receiver.url},
                }
            )
        )
        env = {"HOSTED_KEY": SECRET, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        with run_gateway("--config", str(cfg), "--admin-token", "t0ken", env=env) as base:
            client = openai.OpenAI(base_url=base + "/v1", api_key="client-key", max_retries=0)
            out = client.chat.completions.create(model="kimi", messages=[{"role": "user", "content": "hello"}])
            assert out.choices[0].message.content
            fake.error_status = 500  # an upstream failure: its error goes back to the client
            failed = httpx.post(
                base + "/v1/chat/completions", json={"model": "kimi", "messages": [{"role": "user", "content": "x"}]}
            )
            fake.error_status = None
            unknown = httpx.post(base + "/v1/chat/completions", json={"model": "nope", "messages": []})
            metrics = httpx.get(base + "/metrics").text
            state = httpx.get(base + "/admin/state", headers={"authorization": "Bearer t0ken"})
            assert state.json()["backends"]["hosted"]["engine"] == "openai"
            for _ in range(100):
                if receiver.spans:
                    break
                time.sleep(0.05)
            output = base.output()
    # It reached the upstream, as a bearer token, with the backend's served name.
    posts = [r for r in fake.requests if r["path"] == "/v1/chat/completions"]
    assert posts and all(r["headers"].get("authorization") == f"Bearer {SECRET}" for r in posts)
    assert all(r["body"]["model"] == SERVED for r in posts)
    # And nowhere else.
    assert failed.status_code >= 400 and unknown.status_code in (400, 404)
    assert receiver.spans, "the gateway exported its traces"
    assert " DEBUG " in output and '"backend":"hosted"' in output  # debug logs and the access log were on
    for where, text in {
        "gateway output (debug logs, access log)": output,
        "/metrics": metrics,
        "traces": json.dumps(receiver.spans, default=str),
        "error bodies": failed.text + unknown.text,
        "/admin/state": state.text,
    }.items():
        assert SECRET not in text, f"the upstream key leaked into {where}"
        assert SECRET[8:24] not in text, f"part of the upstream key leaked into {where}"
