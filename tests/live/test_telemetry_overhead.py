"""What tracing costs a request: two gateways in front of one fast scripted upstream, one with
tracing off, one sampling every request and exporting to a local OTLP receiver; sequential tiny
streamed requests alternate between them, so both see the same machine load.

    .venv/bin/python -m tests.live.test_telemetry_overhead 200     # the figures for docs/observability.md

The test runs a short version and checks that the comparison is sound (every traced request
exported, nothing exported by the other); it prints the figures but sets no threshold on them.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fake_upstream import SERVED, FakeUpstream
from tests.gateway.observability.test_telemetry import OtlpReceiver
from tests.harness import run_gateway

BODY = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 8}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextlib.contextmanager
def _stack(workdir: Path) -> Iterator[tuple[str, str, OtlpReceiver]]:
    with contextlib.ExitStack() as stack:
        receiver = stack.enter_context(OtlpReceiver().running())
        upstream = FakeUpstream()
        stack.enter_context(upstream.running())
        cfg = workdir / "c.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": upstream.url}]}},
                    "policy": "direct",
                    "log_level": "warning",
                }
            )
        )
        off = stack.enter_context(run_gateway("--config", str(cfg), env={"OTEL_SDK_DISABLED": "true"}))
        on = stack.enter_context(
            run_gateway(
                "--config",
                str(cfg),
                env={
                    "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                    "OTEL_TRACES_SAMPLER": "always_on",
                    "OTEL_BSP_SCHEDULE_DELAY": "200",
                },
            )
        )
        yield off, on, receiver


def measure(n: int, workdir: Path) -> dict[str, Any]:
    with _stack(workdir) as (off, on, receiver), httpx.Client(timeout=30) as client:
        timings: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(n + 10):
            for name, base in (("off", off), ("on", on)) if i % 2 == 0 else (("on", on), ("off", off)):
                t0 = time.perf_counter()
                with client.stream("POST", base + "/v1/chat/completions", json=BODY) as r:
                    assert r.status_code == 200
                    r.read()
                if i >= 10:  # the first ten warm up connections and code paths
                    timings[name].append(time.perf_counter() - t0)
        servers = receiver.wait(
            lambda spans: (lambda s: s if len(s) >= n + 10 else None)([s for s in spans if s["kind"] == 2]), timeout=15
        )
    out: dict[str, Any] = {"requests": n, "exported_server_spans": len(servers)}
    for name, values in timings.items():
        out[f"{name}_p50_ms"] = 1000 * statistics.median(values)
        out[f"{name}_p99_ms"] = 1000 * _pct(values, 0.99)
    out["added_p50_ms"] = out["on_p50_ms"] - out["off_p50_ms"]
    out["added_p99_ms"] = out["on_p99_ms"] - out["off_p99_ms"]
    out["ratio_p50"] = out["on_p50_ms"] / out["off_p50_ms"]
    out["ratio_p99"] = out["on_p99_ms"] / out["off_p99_ms"]
    return out


@pytest.mark.slow  # > 5 s here
def test_tracing_overhead_comparison_is_sound(tmp_path: Path) -> None:
    result = measure(30, tmp_path)
    print(result)
    assert result["exported_server_spans"] == 40, "every traced request (warm-up included) exported"
    assert result["on_p50_ms"] > 0 and result["off_p50_ms"] > 0


if __name__ == "__main__":
    import tempfile

    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(count, Path(tmp))
    for key, value in figures.items():
        print(f"{key:24} {value:.3f}" if isinstance(value, float) else f"{key:24} {value}")
