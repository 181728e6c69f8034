"""gateway/request/overload.py: the loop-lag monitor (``Overload``) and the load-shedding middleware
(``OverloadGuard``), directly over recording ASGI callables; then overload failing safe end to end: a
healthy upstream, a gateway driven past its capacity.

No backend leaves rotation, every admitted stream completes, refused requests get 503 + Retry-After
with code ``overloaded``. Capacity is made tiny by configuration (one upstream connection; two
requests in flight), so the test is about the gateway's behaviour, not this machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from starlette.types import Message, Receive, Scope, Send

from backends.failures import backend_fault, stream_fault
from gateway.config.schema import OverloadConfig
from gateway.observability.access import SCOPE_KEY, AccessRecord
from gateway.request.overload import CODE, MESSAGE, Overload, OverloadGuard, Reply
from tests.fake_upstream import SERVED, FakeUpstream, script_events
from tests.harness import run_gateway

BODY = {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "hello"}]}


def write_config(path: Path, *urls: str, **extra: object) -> str:
    config = {
        "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": u} for u in urls]}},
        "health": {"interval_s": 0.2, "load_interval_s": 0.5},
        "policy": "direct",
        **extra,
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


# ----- the monitor ---------------------------------------------------------------------------------


async def test_the_monitor_measures_a_blocked_loop_and_stops() -> None:
    ov = Overload(OverloadConfig(interval_ms=10, max_lag_ms=80, window_s=1.0, hold_s=1.0))
    created = ov.last_tick
    ov.start()
    try:
        await asyncio.sleep(0.03)
        assert ov.last_tick > created and not ov.lagging(), "ticking, on time"
        time.sleep(0.15)  # the loop is blocked: the next tick runs late
        await asyncio.sleep(0.03)
        assert ov.max_lag_s >= 0.1 and ov.lagging(), "a tick later than max_lag_ms: timeouts now prove nothing"
        assert not ov.behind() and ov.reason() is None, "one slow tick in a 1 s window sheds nothing"
    finally:
        await ov.stop()
    ticked = ov.last_tick
    await asyncio.sleep(0.05)
    assert ov.last_tick == ticked, "stopped: no more ticks"
    assert not ov.lagging(now=ov.late_until + 1), "a stopped monitor is never overdue"


def test_the_refusal_is_in_openais_envelope_except_on_messages() -> None:
    ov = Overload(OverloadConfig(retry_after_s=7))
    headers, body = ov.refusal("/v1/chat/completions")
    error = orjson.loads(body)["error"]
    assert error["code"] == CODE and error["message"] == MESSAGE
    assert dict(headers) == {
        b"content-type": b"application/json",
        b"content-length": str(len(body)).encode(),
        b"retry-after": b"7",
        b"x-cachegate-code": b"overloaded",
    }
    _, anthropic = ov.refusal("/v1/messages")
    assert orjson.loads(anthropic) == {"type": "error", "error": {"type": "overloaded_error", "message": MESSAGE}}


# ----- the guard -----------------------------------------------------------------------------------


class App:
    """A raw ASGI endpoint that records its calls (and the guard's in-flight count while it runs)."""

    def __init__(self, ov: Overload, fail: bool = False) -> None:
        self.ov, self.fail = ov, fail
        self.calls: list[str] = []
        self.inflight_seen: list[int] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls.append(scope["path"])
        self.inflight_seen.append(self.ov.inflight)
        if self.fail:
            raise RuntimeError("boom")

    def overloaded(self, message: str, retry_after_s: int) -> Reply:
        return [(b"x-own", str(retry_after_s).encode())], b"own:" + message.encode()


def scope(path: str, method: str = "POST", kind: str = "http") -> Scope:
    return {"type": kind, "method": method, "path": path, "headers": [(b"x-api-key", b"k")], SCOPE_KEY: AccessRecord()}


async def call(guard: OverloadGuard, s: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await guard(s, receive, send)
    return sent


def behind(ov: Overload) -> None:
    ov.avg_lag_s = ov.config.max_lag_ms / 1000 * 2


async def test_a_worker_behind_sheds_new_posts_on_the_shed_paths_only() -> None:
    ov = Overload(OverloadConfig(retry_after_s=2))
    inner = App(ov)
    shed: list[tuple[str | None, str]] = []
    guard = OverloadGuard(inner, ov, lambda h, r: shed.append((h.get("x-api-key"), r)))
    behind(ov)
    for s in (scope("/v1/chat/completions", "GET"), scope("/readyz"), scope("/v1/x", kind="websocket")):
        assert await call(guard, s) == []
    assert inner.calls == ["/v1/chat/completions", "/readyz", "/v1/x"], "GETs, other paths, non-HTTP: passed on"
    s = scope("/v1/messages")
    sent = await call(guard, s)
    assert inner.calls[-1] == "/v1/x", "a shed request never reaches the app"
    assert sent[0]["status"] == 503 and (b"retry-after", b"2") in sent[0]["headers"]
    assert orjson.loads(sent[1]["body"])["error"]["type"] == "overloaded_error" and not sent[1]["more_body"]
    assert s[SCOPE_KEY].status == 503, "the access log learns the status"
    assert ov.shed == 1 and shed == [("k", ov.reason())]


async def test_a_direct_endpoint_is_called_without_the_app_and_sheds_in_its_own_envelope() -> None:
    ov = Overload(OverloadConfig(max_inflight=1, retry_after_s=4))
    inner, endpoint = App(ov), App(ov)
    guard = OverloadGuard(inner, ov, lambda h, r: None, direct={"/v1/shout": endpoint})
    assert await call(guard, scope("/v1/shout")) == []
    assert endpoint.calls == ["/v1/shout"] and endpoint.inflight_seen == [1] and inner.calls == []
    assert ov.inflight == 0
    assert await call(guard, scope("/v1/chat/completions")) == []
    assert inner.calls == ["/v1/chat/completions"] and inner.inflight_seen == [0], (
        "with direct endpoints, other paths are not counted nor shed"
    )
    ov.inflight = 1  # another request holds the one place
    sent = await call(guard, scope("/v1/shout"))
    assert sent[0]["status"] == 503 and sent[0]["headers"] == [(b"x-own", b"4")]
    assert sent[1]["body"] == b"own:" + MESSAGE.encode() and endpoint.calls == ["/v1/shout"]


async def test_the_in_flight_count_is_given_back_when_the_endpoint_fails() -> None:
    ov = Overload(OverloadConfig())
    endpoint = App(ov, fail=True)
    guard = OverloadGuard(App(ov), ov, lambda h, r: None, direct={"/v1/chat/completions": endpoint})
    with pytest.raises(RuntimeError):
        await call(guard, scope("/v1/chat/completions"))
    assert endpoint.inflight_seen == [1] and ov.inflight == 0 and ov.shed == 0


async def test_shedding_logs_once_per_episode(caplog: pytest.LogCaptureFixture) -> None:
    ov = Overload(OverloadConfig())
    guard = OverloadGuard(App(ov), ov, lambda h, r: None)
    behind(ov)
    with caplog.at_level("WARNING", logger="cachegate.overload"):
        for _ in range(3):
            await call(guard, scope("/v1/completions"))
    assert ov.shed == 3 and len(caplog.records) == 1 and "shedding new requests" in caplog.text


# ----- end to end ----------------------------------------------------------------------------------


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
