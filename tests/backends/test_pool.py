"""``backends/pool.py``: backends per model alias, the schedule (health checks, self-description reads,
load polls over real HTTP on loopback: the twin and tests/fake_upstream.py), capacity and where it came
from, circuit breakers, a learned limit's samples, and the listeners told of every change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.config import HealthConfig, ModelConfig
from backends.engines.base import Reply
from backends.pool import Backend, BackendPool, poll_connections
from backends.sim.testing import run_twin
from policies.types import BackendView
from tests.fake_upstream import SERVED, FakeUpstream, free_port


@dataclass
class PoolConfig:
    """The pool's part of the configuration (``backends.config.PoolConfig``), nothing of the gateway's."""

    models: Mapping[str, ModelConfig]
    health: HealthConfig = field(default_factory=lambda: HealthConfig(interval_s=30, load_interval_s=30, timeout_s=1))
    breaker: Mapping[str, Any] = field(default_factory=lambda: {"open_s": 5.0})

    def upstream_model(self, alias: str) -> str:
        return self.models[alias].upstream_model or alias


def config(*backends: dict[str, Any], upstream: str = SERVED, **health: float) -> PoolConfig:
    model = ModelConfig.model_validate({"upstream_model": upstream, "backends": list(backends)})
    base = {"interval_s": 30, "load_interval_s": 30, "timeout_s": 1}
    return PoolConfig({"kimi": model}, HealthConfig.model_validate({**base, **health}))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Heard:
    """A listener: every (alias, views) the pool announced."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[BackendView]]] = []

    def __call__(self, alias: str, views: list[BackendView]) -> None:
        self.calls.append((alias, views))


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.fixture()
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream().running() as upstream:
        yield upstream


def test_backends_per_alias_capacity_sources_and_what_the_core_routes_over() -> None:
    cfg = PoolConfig(
        {
            "kimi": ModelConfig.model_validate(
                {
                    "backends": [
                        {"url": "http://p:1", "role": "prefill", "bootstrap_port": 8998},
                        {"url": "http://d:1", "role": "decode", "kv_tokens": 100_000},
                    ]
                }
            ),
            "hosted": ModelConfig.model_validate(
                {
                    "backends": [
                        {"url": "https://api.example", "engine": "openai"},
                        {"url": "http://o:1", "engine": "openai", "kv_tokens": 5},
                    ]
                }
            ),
        }
    )
    pool = BackendPool(cfg, polled=False)
    assert pool.client is None and poll_connections(cfg) == 2 * 4 + 2
    assert [b.name for b in pool.all()] == ["p:1", "d:1", "api.example", "o:1"]
    assert [v.name for v in pool.views("kimi")] == ["d:1"]  # prefill partners are chosen at dispatch
    assert [b.name for b in pool.prefills("kimi")] == ["p:1"] and pool.prefills("hosted") == []
    decode = pool.get("kimi", "d:1")
    assert (decode.max_total_num_tokens, decode.capacity_source, decode.upstream_model) == (
        100_000,
        "configured",
        "kimi",
    )
    learned, configured = pool.get("hosted", "api.example"), pool.get("hosted", "o:1")
    assert learned.limiter is not None and learned.capacity_source == "learned"
    assert learned.max_running_requests == learned.limiter.seats() == 8
    assert configured.limiter is None and configured.capacity_source == "configured"
    assert pool.views("nope") == [] and not pool.any_healthy()
    with pytest.raises(KeyError):
        pool.get("kimi", "x:1")


async def test_start_reads_an_sglang_server_and_tells_every_listener() -> None:
    with run_twin("tiny", time_scale=0.05) as url:
        pool = BackendPool(config({"url": url}, upstream="moonshotai/Kimi-K2-Instruct"))
        heard = Heard()
        pool.subscribe(heard)
        assert heard.calls == [("kimi", [pool.all()[0].view()])]  # at once, with the current views
        await pool.start()
        try:
            b = pool.all()[0]
            assert b.healthy and b.engine == "sglang" and b.info_fetched
            assert (b.max_total_num_tokens, b.capacity_source, b.max_running_requests) == (65_536, "reported", 64)
            assert b.max_model_len == 262_144 and b.served_models == ["moonshotai/Kimi-K2-Instruct"]
            assert b.routes is not None and "/v1/chat/completions" in b.routes and "/v1/messages" in b.routes
            assert heard.calls[-1][1][0].healthy and heard.calls[-1][1][0].kv_tokens == 65_536
        finally:
            await pool.stop()


async def test_health_checks_take_a_backend_out_after_failures_to_eject_and_put_it_back(fake: FakeUpstream) -> None:
    pool = BackendPool(config({"url": fake.url}, interval_s=0.02, failures_to_eject=2))
    heard = Heard()
    pool.subscribe(heard)
    await pool.start()
    try:
        b = pool.all()[0]
        assert b.healthy and b.engine == "sglang" and b.max_total_num_tokens == fake.kv_tokens
        assert b.routes == frozenset()  # no /openapi.json: every surface in auto mode translates
        fake.healthy = False
        await until(lambda: b.failures >= 1)
        await until(lambda: not b.health_ok)
        assert b.failures >= 2 and b.last_error == "/health answered 503" and not heard.calls[-1][1][0].healthy
        fake.healthy = True
        await until(lambda: b.healthy)
        assert (b.failures, b.last_error) == (0, "") and heard.calls[-1][1][0].healthy
    finally:
        await pool.stop()


async def test_load_polls_update_the_view(fake: FakeUpstream) -> None:
    fake.kv_tokens = 123_000
    pool = BackendPool(config({"url": fake.url}, load_interval_s=0.02))
    heard = Heard()
    pool.subscribe(heard)
    await pool.start()
    try:
        b = pool.all()[0]
        await until(lambda: b.loads_at > 0)
        assert (b.token_usage, b.max_total_num_tokens, b.capacity_source) == (0.1, 123_000, "reported")
        assert heard.calls[-1][1][0].token_usage == 0.1
    finally:
        await pool.stop()


async def test_a_backend_that_refuses_connections_is_out_of_rotation_from_the_start() -> None:
    pool = BackendPool(config({"url": f"http://127.0.0.1:{free_port()}"}))
    await pool.start()
    try:
        b = pool.all()[0]
        assert not b.healthy and not b.info_fetched and b.failures == 1
        assert b.last_error.startswith("ConnectError")
    finally:
        await pool.stop()


async def test_configured_capacity_holds_and_surprises_are_logged(
    fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    pool = BackendPool(config({"url": fake.url, "kv_tokens": 50_000, "dp_size": 2}, upstream="not-served"))
    with caplog.at_level(logging.WARNING, logger="cachegate.pool"):
        await pool.start()
        await pool.stop()
    b = pool.all()[0]
    assert (b.max_total_num_tokens, b.capacity_source, b.reported_dp_size) == (50_000, "configured", 1)
    assert "configured kv_tokens=50000, the server reports 100000 per rank (configured holds)" in caplog.text
    assert "configured dp_size=2 but the server reports dp_size=1" in caplog.text
    assert f"serves ['{SERVED}'], not the configured upstream model 'not-served'" in caplog.text
    pool._apply_loads(b, {"loads": [{"max_total_num_tokens": 7, "num_running_reqs": 2}]})
    assert (b.max_total_num_tokens, b.running) == (50_000, 2)  # a load poll never overrides it either


async def test_an_openai_endpoint_keeps_its_learned_limit_and_checks_health_by_the_model_list(
    fake: FakeUpstream,
) -> None:
    seen: list[tuple[str, dict[str, str]]] = []

    class Recording:
        """The pool's ``Getter``: a real httpx client that notes what it was asked."""

        def __init__(self) -> None:
            self.client = httpx.AsyncClient()

        async def get(self, url: str, headers: dict[str, str], timeout_s: float) -> Reply:
            seen.append((url, headers))
            return await self.client.get(url, headers=headers, timeout=timeout_s)

        async def aclose(self) -> None:
            await self.client.aclose()

    pool = BackendPool(config({"url": fake.url, "engine": "openai", "api_key": "sk-up"}), client=Recording())
    await pool.start()
    await pool.stop()
    b = pool.all()[0]
    assert b.healthy and b.capacity_source == "learned" and b.max_total_num_tokens == 0
    assert b.max_running_requests == 8  # the limiter's, not overwritten by an empty self-description
    paths = [u.removeprefix(fake.url) for u, _ in seen]
    assert paths[0] == "/v1/models" and "/get_server_info" not in paths
    assert all(h == {"authorization": "Bearer sk-up"} for _, h in seen)


class InProcess:
    """The pool's ``Getter`` over httpx to an ASGI app in this process (the backend's host is ignored)."""

    def __init__(self, app: Starlette) -> None:
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))

    async def get(self, url: str, headers: dict[str, str], timeout_s: float) -> Reply:
        return await self.client.get(url, headers=headers, timeout=timeout_s)

    async def aclose(self) -> None:
        await self.client.aclose()


def odd_models_server(models: object) -> Starlette:
    """An SGLang-like server whose ``/v1/models`` answers 200 with ``models``."""

    async def health(_: object) -> Response:
        return Response(status_code=200)

    async def info(_: object) -> JSONResponse:
        return JSONResponse({"max_total_num_tokens": 1000, "dp_size": 1})

    async def listed(_: object) -> JSONResponse:
        return JSONResponse(models)

    return Starlette(routes=[Route("/health", health), Route("/get_server_info", info), Route("/v1/models", listed)])


async def test_a_model_list_that_is_not_an_object_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    pool = BackendPool(config({"url": "http://h:1"}), client=InProcess(odd_models_server(["kimi"])))
    with caplog.at_level(logging.WARNING, logger="cachegate.pool"):
        await pool.start()
        await pool.stop()
    b = pool.all()[0]
    assert b.healthy and b.max_total_num_tokens == 1000 and b.served_models == []
    assert "could not read /v1/models" in caplog.text


async def test_a_model_list_whose_data_is_null_is_only_logged() -> None:
    pool = BackendPool(config({"url": "http://h:1"}), client=InProcess(odd_models_server({"data": None})))
    try:
        await pool.start()
    finally:
        await pool.stop()
    assert pool.all()[0].healthy


def test_request_outcomes_drive_the_breaker_and_a_health_check_is_the_half_open_probe() -> None:
    clock = Clock()
    pool = BackendPool(config({"url": "http://a:1"}, failures_to_eject=2), polled=False, clock=clock)
    heard = Heard()
    pool.subscribe(heard)
    b = pool.all()[0]
    pool.mark_ok(b)
    assert b.healthy and len(heard.calls) == 2
    for _ in range(4):
        pool.request_failed(b, "timeout", "read timeout")
    pool.request_ok(b)  # a success breaks the streak
    for _ in range(4):
        pool.request_failed(b, "status_5xx", "502")
    assert b.healthy and b.last_error == "502"
    pool.request_failed(b, "connect", "refused")  # trips at once
    assert not b.healthy and b.breaker_state == 2 and len(heard.calls) == 3
    clock.now += 5.0  # half-open: a failed probe opens it again, for twice as long
    pool.mark_failure(b, "/health answered 503")
    assert b.breaker.state(clock.now) == "open" and b.breaker.open_s == 10.0
    clock.now += 10.0
    pool.mark_ok(b)  # the probe passes: closed, back in rotation
    assert b.healthy and b.breaker.state(clock.now) == "closed" and heard.calls[-1][1][0].healthy


def test_failed_health_checks_eject_only_after_the_configured_count() -> None:
    pool = BackendPool(config({"url": "http://a:1"}, failures_to_eject=3), polled=False)
    b = pool.all()[0]
    pool.mark_ok(b)
    pool.mark_failure(b, "e1")
    pool.mark_failure(b, "e2")
    assert b.healthy and b.failures == 2
    pool.mark_failure(b, "e3")
    assert not b.healthy and b.last_error == "e3"


def test_a_learned_limit_moves_with_observed_latency_and_admission_hears_of_it() -> None:
    clock = Clock()
    pool = BackendPool(config({"url": "http://o:1", "engine": "openai"}), polled=False, clock=clock)
    heard = Heard()
    pool.subscribe(heard)
    b = pool.all()[0]
    assert b.limiter is not None and b.max_running_requests == 8
    for i in range(40):  # fast answers with the seats full: the limit grows
        clock.now += 0.1
        pool.observe_latency(b, 0.05, prompt_tokens=100, cached_tokens=0, inflight=8 + i)
    assert b.max_running_requests > 8 and b.max_running_requests == b.limiter.seats()
    assert heard.calls[-1][1][0].max_running_requests == b.max_running_requests
    reported = BackendPool(config({"url": "http://s:1", "engine": "sglang"}), polled=False)
    fixed = reported.all()[0]
    reported.observe_latency(fixed, 9.0, prompt_tokens=1, cached_tokens=0, inflight=1)  # no limiter: ignored
    assert fixed.limiter is None and fixed.max_running_requests == 0


def test_an_sglang_loads_answer_is_applied_as_the_simulator_feeds_it() -> None:
    clock = Clock()
    pool = BackendPool(config({"url": "http://a:1"}), polled=False, clock=clock)
    b: Backend = pool.all()[0]
    pool._apply_loads(b, {"loads": []})
    assert b.loads_at == 0.0  # nothing listed: nothing applied
    pool._apply_loads(b, {"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 4, "token_usage": 0.5,
                                     "cache_hit_rate": 0.25, "max_total_num_tokens": 9_000}]})  # fmt: skip
    assert (b.running, b.waiting, b.token_usage, b.cache_hit_rate) == (3, 4, 0.5, 0.25)
    assert (b.max_total_num_tokens, b.capacity_source, b.loads_at) == (9_000, "reported", 1000.0)
