"""A disaggregated turn's trace: both legs are CLIENT spans under the request's server span."""

from __future__ import annotations

import httpx
import pytest

from backends.sim.testing import free_port, run_twin
from tests.gateway.observability.test_telemetry import KIND_CLIENT, OtlpReceiver
from tests.harness import run_gateway


@pytest.mark.slow  # a gateway process: about 5 s
def test_both_legs_are_spans_of_the_request() -> None:
    bootstrap = free_port()
    twin = {"model": "kimi", "answer_scale": 0.02}
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    with (
        OtlpReceiver().running() as receiver,
        run_twin("tiny", **twin, disaggregation_mode="prefill", disaggregation_bootstrap_port=bootstrap) as prefill,
        run_twin("tiny", **twin, disaggregation_mode="decode") as decode,
        run_gateway(
            "--model", "kimi", "--prefill", f"{prefill}:{bootstrap}", "--decode", decode,
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
        ) as gateway,
    ):  # fmt: skip
        r = httpx.post(
            gateway + "/v1/chat/completions",
            json={"model": "kimi", "messages": [{"role": "user", "content": "trace me"}]},
            timeout=30,
        )
        assert r.status_code == 200
        server, spans = receiver.trace_of(r.headers["x-request-id"], children=4)
        legs = {s["attrs"]["cachegate.backend"]: s for s in spans if s["kind"] == KIND_CLIENT}
        p, d = legs[prefill.split("//")[1]], legs[decode.split("//")[1]]
        assert p["parent"] == d["parent"] == server["span_id"]
        assert p["attrs"]["cachegate.pd.leg"] == "prefill" and isinstance(
            p["attrs"]["cachegate.pd.bootstrap_room"], int
        )
        assert p["attrs"]["http.response.status_code"] == d["attrs"]["http.response.status_code"] == 200
        assert p["start"] <= d["end"] and d["start"] <= p["end"]  # sent at once, not one after the other
