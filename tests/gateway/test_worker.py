"""gateway/worker.py: ``Gateway``, one worker's parts and how they are wired: what the config builds, the
upstream hop that exists only while started, shared state's callbacks reaching the core (limits, share),
the pool's changes reaching the core and the gauges, and what ``routed`` and ``shed`` count.

Started for real over tests/fake_upstream.py (no app around it: ``Gateway.start``/``stop`` directly)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.datastructures import Headers

from gateway.config.schema import Config, hash_key
from gateway.observability.spans import NULL_TRACE
from gateway.state.replicas import MemoryState, RedisState
from gateway.worker import Gateway
from policies.admission import SeatedAdmission
from policies.core import PassThroughCore
from policies.types import Dispatch, RequestFacts
from tests.fake_upstream import FakeUpstream
from tests.gateway.asgi import config


def sample(gw: Gateway, name: str, **labels: str) -> float | None:
    """One sample of the worker's ``/metrics`` body, None if absent."""
    body, _ = gw.metrics.exposition()
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


@pytest.fixture()
def made() -> Iterator[list[Gateway]]:
    """Gateways a test builds without starting: their metrics closed afterwards."""
    built: list[Gateway] = []
    yield built
    for gw in built:
        gw.metrics.close()


def build(made: list[Gateway], cfg: Config, admin_token: str | None = None) -> Gateway:
    gw = Gateway(cfg, admin_token=admin_token)
    made.append(gw)
    return gw


def test_the_config_chooses_the_core_the_state_and_the_keys(made: list[Gateway]) -> None:
    gated = build(made, config("http://127.0.0.1:1", teams={"t": {"max_concurrency": 3}}))
    assert isinstance(gated.core, SeatedAdmission) and isinstance(gated.state, MemoryState)
    assert gated.core.limits["t"].max_concurrency == 3, "the core is configured with the teams"
    assert gated.keys.open and gated.kv is None and gated.pool is None and gated.wire is None
    direct = build(
        made,
        config(
            "http://127.0.0.1:1", policy="direct", redis_url="redis://127.0.0.1:1/0", keys=[{"sha256": hash_key("k")}]
        ),
    )
    assert isinstance(direct.core, PassThroughCore) and isinstance(direct.state, RedisState)
    assert not direct.keys.open


def test_the_admin_token_comes_from_the_argument_or_the_environment(
    made: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config("http://127.0.0.1:1")
    monkeypatch.delenv(cfg.admin_token_env, raising=False)
    assert build(made, cfg).admin_token is None
    monkeypatch.setenv(cfg.admin_token_env, "")
    assert build(made, cfg).admin_token is None, "an empty variable is no token"
    monkeypatch.setenv(cfg.admin_token_env, "from-env")
    assert build(made, cfg).admin_token == "from-env"
    assert build(made, cfg, admin_token="given").admin_token == "given"


def test_the_upstream_hop_exists_only_once_started(made: list[Gateway]) -> None:
    gw = build(made, config("http://127.0.0.1:1"))
    with pytest.raises(AssertionError, match="not started"):
        _ = gw.upstream


async def test_start_wires_the_pool_to_the_core_and_the_gauges_and_stop_closes(upstream: FakeUpstream) -> None:
    cfg = config(upstream.url, teams={"default": {"max_concurrency": 5}})
    gw = Gateway(cfg)
    opened = len(upstream.connections)
    await gw.start()
    try:
        name = f"127.0.0.1:{upstream.port}"
        assert gw.pool is not None and [b.name for b in gw.pool.all()] == [name]
        assert gw.wire is not None and gw.wire.max_connections == cfg.upstream_connections()
        assert gw.upstream.pool is gw.pool and gw.upstream.client is gw.wire
        assert sample(gw, "cachegate_backend_healthy", backend=name) == 1.0
        assert sample(gw, "cachegate_upstream_errors_total", backend=name, kind="connect") == 0.0
        first = gw.dispatcher.admit_now(RequestFacts(rid="r1", model="kimi", team="default", prompt_tokens=10))
        assert isinstance(first, Dispatch) and first.backend == name, "the core knows the pool's backends"
        gw.pool.request_failed(gw.pool.get("kimi", name), "connect", "refused")  # the breaker opens
        assert sample(gw, "cachegate_backend_healthy", backend=name) == 0.0
        assert sample(gw, "cachegate_backend_breaker_state", backend=name) == 2.0
        assert sample(gw, "cachegate_wait_bound_seconds", team="default") == cfg.teams["default"].max_wait_s
    finally:
        await gw.stop()
    mine = upstream.connections[opened:]
    assert mine, "the pool's checks reached the backend"
    for _ in range(100):
        if all(c.closed is not None for c in mine):
            break
        await asyncio.sleep(0.01)
    assert all(c.closed is not None for c in mine), "stopped: no connection left open to the backend"


async def test_runtime_limits_reach_the_core_and_unknown_fields_are_dropped(made: list[Gateway]) -> None:
    gw = build(made, config("http://127.0.0.1:1"))
    await gw.state.set_team("t", {"max_concurrency": 7, "max_queue": 2, "from_a_newer_version": True})
    assert gw.core.limits["t"].max_concurrency == 7 and gw.core.limits["t"].max_queue == 2


async def test_a_share_change_reaches_the_core_and_the_degraded_gauge(made: list[Gateway]) -> None:
    shared = build(made, config("http://127.0.0.1:1", redis_url="redis://127.0.0.1:1/0"))
    assert isinstance(shared.core, SeatedAdmission)
    shared.state.on_share(0.5, True)
    assert shared.core.share == 0.5 and shared.core.split_concurrency
    assert sample(shared, "cachegate_redis_degraded") == 1.0
    shared.state.on_share(1.0, False)
    assert sample(shared, "cachegate_redis_degraded") == 0.0
    alone = build(made, config("http://127.0.0.1:1"))
    alone.state.on_share(0.5, True)
    assert sample(alone, "cachegate_redis_degraded") == 0.0, "no Redis configured: nothing degraded"


def test_routed_counts_each_dispatch_used(made: list[Gateway]) -> None:
    gw = build(made, config("http://127.0.0.1:1"))
    gw.routed("kimi", Dispatch("r1", "b0", reason="least_wait"), NULL_TRACE)
    gw.routed("kimi", Dispatch("r1", "b1", reason="retry"), NULL_TRACE)
    gw.routed("kimi", Dispatch("r2", "b1", reason="retry"), NULL_TRACE)
    total = "cachegate_route_decisions_total"
    assert sample(gw, total, model="kimi", backend="b0", reason="least_wait") == 1.0
    assert sample(gw, total, model="kimi", backend="b1", reason="retry") == 2.0


def test_shed_counts_the_refusal_for_the_callers_team(made: list[Gateway]) -> None:
    gw = build(made, config("http://127.0.0.1:1", keys=[{"sha256": hash_key("sk-p"), "team": "platform"}]))
    gw.shed(Headers({"authorization": "Bearer sk-p"}), "behind")
    gw.shed(Headers({"authorization": "Bearer wrong"}), "behind")
    gw.shed(Headers({}), "behind")
    refusals = "cachegate_admission_refusals_total"
    assert sample(gw, refusals, team="platform", reason="overloaded") == 1.0
    assert sample(gw, refusals, team="unknown", reason="overloaded") == 2.0
    assert sample(gw, "cachegate_requests_total", team="unknown", model="", backend="", status="503") == 2.0
