"""Overload fails safe: a healthy upstream, a gateway driven past its capacity.

No backend leaves rotation, every admitted stream completes, refused requests get 503 + Retry-After
with code ``overloaded``. Capacity is made tiny by configuration (one upstream connection; two
requests in flight), so the test is about the gateway's behaviour, not this machine's speed.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from backends.failures import backend_fault, stream_fault
from gateway.config.schema import OverloadConfig
from gateway.request.overload import Overload
from tests.fake_upstream import FakeUpstream, script_events
from tests.gateway.test_proxy import write_config
from tests.harness import run_gateway

BODY = {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "hello"}]}


def _stream(base: str) -> tuple[int, dict[str, str], bytes]:
    with httpx.stream("POST", base + "/v1/chat/completions", json=BODY, timeout=30) as r:
        return r.status_code, dict(r.headers), r.read()


def _drive(base: str, n: int, backend: str) -> tuple[list[tuple[int, dict[str, str], bytes]], list[bool]]:
    """``n`` concurrent streams, while a watcher records whether the backend stays in rotation."""
    healthy: list[bool] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            healthy.append(httpx.get(base + "/readyz").json()["backends"][backend]["healthy"])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(lambda _: _stream(base), range(n)))
    finally:
        stop.set()
        watcher.join()
    return results, healthy


def _check(results: list[tuple[int, dict[str, str], bytes]], healthy: list[bool], expected: bytes) -> None:
    admitted = [body for status, _, body in results if status == 200]
    refused = [(headers, body) for status, headers, body in results if status == 503]
    assert len(admitted) + len(refused) == len(results), [s for s, _, _ in results]
    assert admitted and refused, "the burst must both be served and go past capacity"
    assert all(body == expected for body in admitted), "every admitted stream completes byte for byte"
    for headers, body in refused:
        assert int(headers["retry-after"]) >= 1
        assert httpx.Response(503, content=body).json()["error"]["code"] == "overloaded"
    assert healthy and all(healthy), "a healthy backend never leaves rotation"


def test_full_connection_budget_sheds_and_never_ejects(tmp_path: Path) -> None:
    up = FakeUpstream(chunk_delay_s=0.15)
    with up.running():
        cfg = write_config(
            tmp_path / "c.yaml",
            up.url,
            upstream={"max_connections": 1, "connect_timeout_s": 0.3},
            health={"interval_s": 0.1, "load_interval_s": 0.1, "failures_to_eject": 1},
        )
        with run_gateway("--config", cfg) as base:
            expected = b"".join(script_events("plain", include_usage=False))
            results, healthy = _drive(base, 4, f"127.0.0.1:{up.port}")
            _check(results, healthy, expected)
            assert 'reason="overloaded"' in httpx.get(base + "/metrics").text
            assert _stream(base)[0] == 200, "still in rotation afterwards"


def test_requests_in_flight_cap_sheds_new_requests_only(tmp_path: Path) -> None:
    up = FakeUpstream(chunk_delay_s=0.1)
    with up.running():
        cfg = write_config(tmp_path / "c.yaml", up.url, overload={"max_inflight": 2})
        with run_gateway("--config", cfg) as base:
            expected = b"".join(script_events("plain", include_usage=False))
            results, healthy = _drive(base, 6, f"127.0.0.1:{up.port}")
            _check(results, healthy, expected)
            assert sum(1 for s, _, _ in results if s == 200) <= 2 + 1  # a slot freed mid-burst may admit one more
            assert 'reason="overloaded"' in httpx.get(base + "/metrics").text


def test_sustained_lag_sheds_a_single_slow_tick_does_not() -> None:
    ov = Overload(OverloadConfig(max_lag_ms=100, window_s=1.0, hold_s=1.0, max_inflight=3))
    ov.observe(0.05, 0.1, now=10.0)
    assert not ov.lagging(now=10.0) and ov.reason() is None
    ov.observe(0.2, 0.25, now=10.0)  # one slow tick: timeouts now are not the backend's fault ...
    assert ov.lagging(now=10.5) and not ov.lagging(now=11.1)
    ov._timer = object()  # type: ignore[assignment]  # as if the monitor were running
    assert ov.lagging(now=10.0 + 0.05 + 0.1 + 0.01), "the monitor overdue: the loop is stalled now"
    ov._timer = None
    assert ov.reason() is None, "... but it alone sheds nothing"
    for _ in range(5):  # the loop stays behind
        ov.observe(0.2, 0.25, now=10.0)
    assert ov.reason() is not None and "behind" in ov.reason()
    for _ in range(40):  # and catches up
        ov.observe(0.0, 0.05, now=12.0)
    assert ov.reason() is None
    ov.inflight = 3
    assert ov.reason() == "3 requests in flight"
    headers, body = ov.refusal("/v1/messages")
    assert b'"overloaded_error"' in body and (b"retry-after", b"1") in headers


@pytest.mark.parametrize(
    ("exc", "lagging", "kind"),
    [
        (httpx.PoolTimeout("full"), False, None),
        (httpx.ConnectTimeout("slow"), True, None),
        (httpx.ConnectTimeout("slow"), False, "timeout"),
        (httpx.ReadTimeout("silent"), True, None),
        (httpx.ReadTimeout("silent"), False, "timeout"),
        (httpx.ConnectError("refused"), True, "connect"),
        (httpx.RemoteProtocolError("reset"), False, "stream_broken"),
    ],
)
def test_only_the_backends_own_failures_count(exc: Exception, lagging: bool, kind: str | None) -> None:
    assert backend_fault(exc, lagging=lagging) == kind


def test_status_and_stream_faults() -> None:
    assert backend_fault(status=503) == "status_5xx" and backend_fault(status=429) is None
    assert stream_fault("timeout", lagging=True) is None and stream_fault("timeout") == "timeout"
    assert stream_fault("stream_broken", lagging=True) == "stream_broken" and stream_fault(None) is None
