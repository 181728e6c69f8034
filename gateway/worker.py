"""Everything one worker (one replica) holds, and how its parts are wired together: config, keys,
decision core and its dispatcher, shared state, backend pool, upstream client (``gateway/http/wire.py``,
its connection budget from ``Config.upstream_connections``), overload monitor, metrics, traces."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from starlette.datastructures import Headers

from backends.config import tls_trust
from backends.pool import BackendPool, poll_connections
from gateway.config.schema import Config, TeamConfig
from gateway.http.errors import GatewayError
from gateway.http.wire_pool import WireClient
from gateway.observability.metrics import Metrics
from gateway.observability.telemetry import RequestTrace, Telemetry
from gateway.request.auth import KeyStore
from gateway.request.dispatch import Dispatcher
from gateway.request.overload import Overload
from gateway.request.upstream import Upstream
from gateway.state.kv_learn import KVView, build_kv_view
from gateway.state.replicas import MemoryState, RedisState
from policies import registry
from policies.tokens import TokenEstimator
from policies.types import BackendView, Dispatch

log = logging.getLogger("cachegate")


class Gateway:
    """One worker's parts. ``start``/``stop`` run in the app's lifespan."""

    def __init__(self, config: Config, metrics: Metrics | None = None, admin_token: str | None = None) -> None:
        self.config = config
        self.keys = KeyStore(config)
        self.metrics = metrics or Metrics()
        self.telemetry = Telemetry(config.telemetry)
        self.core = registry.build(config.policy, router_params=config.router)
        self.core.configure(
            {
                "teams": {n: t.model_dump() for n, t in config.teams.items()},
                "admission": config.admission,
            }
        )
        self.state: MemoryState | RedisState = (
            RedisState(config.redis_url, lease_ttl_s=config.lease_ttl_s) if config.redis_url else MemoryState()
        )
        self.state.on_wake = lambda team: self.dispatcher.wake(team)
        self.state.on_limits = self._limits_changed
        self.state.on_share = self._share_changed
        self.admin_token = admin_token or os.environ.get(config.admin_token_env) or None
        self.dispatcher = Dispatcher(self.core, state=self.state)
        self.kv: KVView | None = build_kv_view(self.core, [b for m in config.models.values() for b in m.backends])
        """The exact cache view (``gateway/state/kv_learn.py``) when some backend publishes KV events."""
        self.estimator = TokenEstimator()
        self.wire: WireClient | None = None
        self.pool: BackendPool | None = None
        self.overload = Overload(config.overload)
        self._upstream: Upstream | None = None
        self.started_at = int(time.time())
        self.responses: Any = None
        """The Responses surface (``gateway/surfaces/responses.py``): its store and running streams."""

    @property
    def upstream(self) -> Upstream:
        """The upstream hop (exists between ``start`` and ``stop``)."""
        assert self._upstream is not None, "the gateway is not started"
        return self._upstream

    def _limits_changed(self, team: str, fields: dict[str, Any]) -> None:
        known = {k: v for k, v in fields.items() if k in TeamConfig.model_fields}
        self.core.set_team(team, TeamConfig.model_validate(known).limits())
        self.dispatcher.wake(team)

    def _share_changed(self, share: float, split: bool) -> None:
        self.metrics.redis_degraded.set(1 if split and self.config.redis_url else 0)
        self.dispatcher.set_share(share, split)

    def routed(self, alias: str, decision: Dispatch, trace: RequestTrace) -> None:
        """A dispatch the request will use (first or retry): counted here, once, not per core decision,
        since a decision the lease then sends back to the queue is not a dispatch."""
        self.metrics.routes.labels(alias, decision.backend, decision.reason).inc()
        trace.routed(decision)

    def shed(self, headers: Headers, reason: str) -> None:
        """A request the overload guard refused before reading it (``gateway/request/overload.py``): counted."""
        try:
            team = self.keys.team_for(headers)
        except GatewayError:
            team = "unknown"
        self.metrics.refusals.labels(team, "overloaded").inc()
        self.metrics.requests.labels(team, "", "", "503").inc()
        log.debug("shed a request: %s", reason)

    async def start(self) -> None:
        up = self.config.upstream
        # Every surface's requests go through the lean client; health checks and load polls through
        # one of their own (a full request budget cannot starve them; on httpx the polls were most of
        # an idle worker's CPU: ``loadtest/bench/instr.py`` prints the idle rate).
        trust = tls_trust(self.config.models.values())
        self.wire = WireClient(
            up.connect_timeout_s, up.idle_timeout_s, up.keepalive_expiry_s, self.config.upstream_connections(), trust
        )
        health = self.config.health
        checks = WireClient(
            health.timeout_s, health.timeout_s, up.keepalive_expiry_s, poll_connections(self.config), trust
        )
        self.pool = BackendPool(self.config, up.keepalive_expiry_s, client=checks)
        self._upstream = Upstream(
            self.wire,
            self.pool,
            self.dispatcher,
            self.metrics,
            up.sse_keepalive_s,
            self.overload.lagging,
            self.config.overload.retry_after_s,
            up.prefill_timeout_s,
        )
        self.pool.subscribe(self._backends_changed)
        self.metrics.init_labels(self.config.teams, (b.name for b in self.pool.all()))
        self.metrics.start()
        self.dispatcher.start()
        self.overload.start()
        await self.state.start()
        await self.pool.start()
        if self.kv is not None:
            self.kv.start()
        if self.keys.open:
            log.warning("no API keys configured: the gateway is open to anyone who can reach it")

    async def stop(self) -> None:
        if self.kv is not None:
            await self.kv.stop()
        if self.pool:
            await self.pool.stop()
        await self.dispatcher.stop()
        await self.overload.stop()
        await self.state.stop()
        if self.wire:
            await self.wire.aclose()
        self.telemetry.shutdown()
        self.metrics.close()

    def _backends_changed(self, alias: str, views: list[BackendView]) -> None:
        self.dispatcher.set_backends(alias, views)
        self._wait_gauges()
        if self.pool is None:
            return
        for backend in self.pool.models.get(alias, []):
            m = self.metrics
            m.backend_healthy.labels(backend.name).set(1 if backend.healthy else 0)
            m.backend_breaker.labels(backend.name).set(backend.breaker_state)
            m.backend_kv.labels(backend.name).set(backend.token_usage)
            m.backend_running.labels(backend.name).set(backend.running)
            m.backend_waiting.labels(backend.name).set(backend.waiting)
            m.backend_hit.labels(backend.name).set(backend.cache_hit_rate)

    def _wait_gauges(self) -> None:
        """Each team's oldest and expected wait and its bound, from the core's snapshot (on every load
        poll: a wait that grows past the bound shows within a poll interval)."""
        teams = self.dispatcher.core.snapshot().get("teams")
        if not isinstance(teams, dict):
            return  # a core without admission keeps no waits
        m = self.metrics
        for name, t in teams.items():
            if "oldest_wait_s" in t:
                m.oldest_wait.labels(name).set(t["oldest_wait_s"])
                m.expected_wait.labels(name).set(t["expected_wait_s"])
                m.wait_bound.labels(name).set(t["max_wait_s"])
