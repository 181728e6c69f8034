"""The pool of SGLang backends: health checks, load polls, capacity and circuit breakers.

A backend is in rotation while its health checks pass (``failures_to_eject`` failures in a row
take it out, the next success puts it back) and its circuit breaker (``policies/breaker.py``) is
not open: requests that fail (connection refused at once; timeouts, 5xx and broken streams by
streak or rate) open it, and a half-open probe (the next health check, or one request) closes it.
A 4xx answer never counts against a backend (that is the request's fault), nor does anything the
gateway does to itself (backends/failures.py). Health checks and load polls use their own small
client, so a request pool that is full or busy cannot starve them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from backends.aio import cancel_and_wait
from backends.config import BackendConfig, PoolConfig
from policies.breaker import STATE_CODE, Breaker
from policies.types import BackendView

log = logging.getLogger("cachegate.pool")
DEFAULT_MODE = "translate"
"""Responses and Messages are translated to chat unless configured otherwise (``docs/clients.md``)."""


@dataclass(slots=True)
class Backend:
    model: str
    config: BackendConfig
    upstream_model: str
    health_ok: bool = False
    breaker: Breaker = field(default_factory=Breaker)
    clock: Callable[[], float] = time.monotonic
    """The pool's clock (the simulator's virtual one there)."""
    failures: int = 0
    last_error: str = ""
    max_total_num_tokens: int = 0
    reported_dp_size: int | None = None
    max_running_requests: int = 0
    """Per DP rank (``/get_server_info``; 0: unknown): a seat budget as much as the token pool."""
    host_tokens: int = 0
    """Host-tier (HiCache) tokens per DP rank (0: none; from the config's ``host_tier_tokens``)."""
    reload_tokens_per_s: float = 0.0
    """How fast a host-tier hit is loaded back (0: no host tier)."""
    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0
    loads_at: float = 0.0
    served_models: list[str] = field(default_factory=list)
    info_fetched: bool = False
    max_model_len: int = 0
    """The context window the engine serves (``/get_model_info`` or ``/get_server_info``; 0: unknown)."""
    routes: frozenset[str] | None = None
    """The paths the backend's ``/openapi.json`` lists (None: not read yet, or not served)."""
    model_surfaces: dict[str, str] = field(default_factory=dict)
    """The model's ``surfaces`` modes (a backend's own ``surfaces`` override them)."""

    @property
    def name(self) -> str:
        return self.config.name or self.config.url

    @property
    def healthy(self) -> bool:
        return self.health_ok and self.breaker.routable(self.clock())

    @property
    def breaker_state(self) -> int:
        """The breaker's state, or open while failed health checks keep the backend out of rotation
        (every way out of rotation shows here)."""
        if not self.health_ok:
            return STATE_CODE["open"]
        return STATE_CODE[self.breaker.state(self.clock())]

    @property
    def url(self) -> str:
        return self.config.url

    @property
    def dp_size(self) -> int:
        return self.config.dp_size

    def headers(self) -> dict[str, str]:
        key = self.config.upstream_key()
        return {"authorization": f"Bearer {key}"} if key else {}

    def mode(self, surface: str, route: str) -> str:
        """``passthrough`` or ``translate`` for a client surface (config, else what the backend serves)."""
        mode = self.config.surfaces.get(surface) or self.model_surfaces.get(surface) or DEFAULT_MODE  # type: ignore[call-overload]
        if mode == "auto":
            return "passthrough" if self.routes is not None and route in self.routes else "translate"
        return str(mode)

    def view(self) -> BackendView:
        return BackendView(
            self.name,
            self.healthy,
            self.max_total_num_tokens,
            self.dp_size,
            self.running,
            self.waiting,
            self.token_usage,
            max_running_requests=self.max_running_requests,
            host_tokens=self.host_tokens,
            reload_tokens_per_s=self.reload_tokens_per_s,
            context_tokens=self.max_model_len,
        )


Listener = Callable[[str, list[BackendView]], None]


class Reply(Protocol):
    """A whole answer to a GET (``httpx.Response`` is one)."""

    @property
    def status_code(self) -> int: ...

    def json(self) -> Any: ...


class Getter(Protocol):
    """What the pool's health checks and load polls GET with: errors are httpx's exception types."""

    async def get(self, url: str, headers: dict[str, str], timeout_s: float) -> Reply: ...

    async def aclose(self) -> None: ...


class _HttpxGetter:
    """A ``Getter`` on httpx (a pool outside the gateway: tests, tools)."""

    def __init__(self, connections: int, keepalive_expiry_s: float) -> None:
        limits = httpx.Limits(
            max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=keepalive_expiry_s
        )
        self.client = httpx.AsyncClient(limits=limits, trust_env=False)

    async def get(self, url: str, headers: dict[str, str], timeout_s: float) -> Reply:
        return await self.client.get(url, headers=headers, timeout=timeout_s)

    async def aclose(self) -> None:
        await self.client.aclose()


def poll_connections(config: PoolConfig) -> int:
    """The connection budget of the pool's checks and polls: at most a check and a poll per backend at a time."""
    return 2 * max(1, sum(len(m.backends) for m in config.models.values())) + 2


class BackendPool:
    def __init__(
        self,
        config: PoolConfig,
        keepalive_expiry_s: float = 3.0,
        *,
        polled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        client: Getter | None = None,
    ) -> None:
        """``polled`` False: a pool that is never started, fed by its caller (the simulator).
        ``client``: what its checks and polls GET with (the gateway gives its lean client, a
        ``gateway.wire_pool.WireClient`` of their own; by default one of httpx)."""
        self.config = config
        # Its own connections, never the requests': a full request budget cannot starve a health check.
        self.client: Getter | None = (
            (client or _HttpxGetter(poll_connections(config), keepalive_expiry_s)) if polled else None
        )
        self.models: dict[str, list[Backend]] = {
            alias: [
                Backend(
                    alias,
                    b,
                    config.upstream_model(alias),
                    model_surfaces={str(k): str(v) for k, v in model.surfaces.items()},
                    breaker=Breaker(**config.breaker),
                    clock=clock,
                    host_tokens=b.host_tier_tokens,  # SGLang does not report its host tier: configured
                    reload_tokens_per_s=b.host_load_tokens_per_s,
                )
                for b in model.backends
            ]
            for alias, model in config.models.items()
        }
        self._listeners: list[Listener] = []
        self._tasks: list[asyncio.Task[None]] = []

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)
        for alias in self.models:
            listener(alias, self.views(alias))

    def _changed(self, alias: str) -> None:
        views = self.views(alias)
        for listener in self._listeners:
            listener(alias, views)

    def views(self, alias: str) -> list[BackendView]:
        """What the decision core routes over: a disaggregated pool's decode backends (its prefill
        partners are chosen at dispatch, gateway/pd_hop.py)."""
        return [b.view() for b in self.models.get(alias, []) if b.config.role != "prefill"]

    def prefills(self, alias: str) -> list[Backend]:
        """A disaggregated model's prefill backends (empty for a co-located one)."""
        return [b for b in self.models.get(alias, []) if b.config.role == "prefill"]

    def all(self) -> list[Backend]:
        return [b for backends in self.models.values() for b in backends]

    def get(self, alias: str, name: str) -> Backend:
        for backend in self.models[alias]:
            if backend.name == name:
                return backend
        raise KeyError(name)

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.all())

    async def start(self) -> None:
        await asyncio.gather(*(self._check(b, first=True) for b in self.all()))
        self._tasks = [
            asyncio.create_task(self._health_loop(), name="pool-health"),
            asyncio.create_task(self._load_loop(), name="pool-loads"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks = []
        if self.client is not None:
            await self.client.aclose()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health.interval_s)
            await asyncio.gather(*(self._check(b) for b in self.all()))

    async def _load_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health.load_interval_s)
            await asyncio.gather(*(self._poll_load(b) for b in self.all() if b.healthy))

    async def _get(self, backend: Backend, path: str) -> Reply:
        assert self.client is not None, "a pool without a client is fed by its caller, never polled"
        return await self.client.get(backend.url + path, backend.headers(), self.config.health.timeout_s)

    async def _check(self, backend: Backend, first: bool = False) -> None:
        try:
            response = await self._get(backend, "/health")
            ok = response.status_code == 200
            error = "" if ok else f"/health answered {response.status_code}"
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if ok:
            if not backend.info_fetched:
                await self._fetch_info(backend, check_models=first or not backend.served_models)
            self.mark_ok(backend)
        else:
            self.mark_failure(backend, error)

    async def _fetch_info(self, backend: Backend, check_models: bool) -> None:
        try:
            info = (await self._get(backend, "/get_server_info")).json()
            backend.max_total_num_tokens = int(info.get("max_total_num_tokens") or 0)
            backend.max_running_requests = int(info.get("max_running_requests") or 0)  # per DP rank: a seat budget
            dp = info.get("dp_size")
            backend.reported_dp_size = int(dp) if dp else None
            if backend.reported_dp_size and backend.dp_size not in (1, backend.reported_dp_size):
                log.warning(
                    "backend %s: configured dp_size=%d but the server reports dp_size=%d",
                    backend.name,
                    backend.dp_size,
                    backend.reported_dp_size,
                )
            backend.max_model_len = int(info.get("max_model_len") or info.get("context_length") or 0)
            backend.info_fetched = True
        except (httpx.HTTPError, ValueError, TypeError) as exc:
            log.warning("backend %s: could not read /get_server_info: %s", backend.name, exc)
        await self._fetch_features(backend)
        if check_models:
            try:
                data = (await self._get(backend, "/v1/models")).json()
                cards = [m for m in data.get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
                backend.served_models = [m["id"] for m in cards]
                for card in cards:  # the model's context window: requests past it are refused at once
                    window = card.get("max_model_len")
                    if card["id"] == backend.upstream_model and isinstance(window, int) and window > 0:
                        backend.max_model_len = window
                if backend.upstream_model not in backend.served_models:
                    log.warning(
                        "backend %s serves %s, not the configured upstream model %r (model %r)",
                        backend.name,
                        backend.served_models,
                        backend.upstream_model,
                        backend.model,
                    )
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                log.warning("backend %s: could not read /v1/models: %s", backend.name, exc)

    async def _fetch_features(self, backend: Backend) -> None:
        """The context window (``/get_model_info``) and the routes served (``/openapi.json``)."""
        try:
            response = await self._get(backend, "/get_model_info")
            if response.status_code == 200:
                length = int(response.json().get("max_model_len") or 0)
                backend.max_model_len = length or backend.max_model_len
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            pass
        try:
            response = await self._get(backend, "/openapi.json")
            paths = response.json().get("paths") if response.status_code == 200 else None
            backend.routes = frozenset(paths) if isinstance(paths, dict) else frozenset()
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            backend.routes = frozenset()

    async def _poll_load(self, backend: Backend) -> None:
        try:
            response = await self._get(backend, "/v1/loads")
            if response.status_code != 200:
                return
            self._apply_loads(backend, response.json())
        except (httpx.HTTPError, ValueError, TypeError):
            return
        self._changed(backend.model)

    @staticmethod
    def _apply_loads(backend: Backend, data: dict[str, Any]) -> None:
        loads = data.get("loads") or []
        if not loads:
            return
        backend.running = sum(int(r.get("num_running_reqs") or 0) for r in loads)
        backend.waiting = sum(int(r.get("num_waiting_reqs") or 0) for r in loads)
        backend.token_usage = max(float(r.get("token_usage") or 0.0) for r in loads)
        backend.cache_hit_rate = sum(float(r.get("cache_hit_rate") or 0.0) for r in loads) / len(loads)
        total = int(loads[0].get("max_total_num_tokens") or 0)
        if total:
            backend.max_total_num_tokens = total
        backend.loads_at = backend.clock()

    def mark_ok(self, backend: Backend) -> None:
        """A passed health check (also the half-open probe of an open breaker)."""
        was = backend.healthy
        backend.failures = 0
        backend.last_error = ""
        backend.health_ok = True
        now = backend.clock()
        if backend.breaker.state(now) == "half_open":
            backend.breaker.success(now)  # the probe: the breaker closes
        if not was and backend.healthy:
            log.info("backend %s (%s) is healthy", backend.name, backend.url)
            self._changed(backend.model)

    def mark_failure(self, backend: Backend, error: str) -> None:
        """A failed health check (a failed probe when the breaker is half-open)."""
        now = backend.clock()
        if backend.breaker.state(now) == "half_open":
            backend.breaker.failure(now)
        backend.failures += 1
        backend.last_error = error
        if backend.health_ok and backend.failures >= self.config.health.failures_to_eject:
            backend.health_ok = False
            log.warning("backend %s (%s) taken out of rotation: %s", backend.name, backend.url, error)
            self._changed(backend.model)
        elif not backend.health_ok and backend.failures == 1:
            log.warning("backend %s (%s) is not healthy: %s", backend.name, backend.url, error)

    def request_ok(self, backend: Backend) -> None:
        """A request got an answer that is not the backend's fault (2xx-4xx, a complete stream)."""
        backend.breaker.success(backend.clock())

    def request_failed(self, backend: Backend, kind: str, error: str) -> None:
        """A request failed on the backend: ``connect`` (trips the breaker at once), ``timeout``,
        ``status_5xx`` or ``stream_broken`` (counted towards opening it)."""
        now = backend.clock()
        was = backend.healthy
        if kind == "connect":
            backend.breaker.trip(now)
        else:
            backend.breaker.failure(now)
        backend.last_error = error
        if was and not backend.healthy:
            log.warning("backend %s (%s): circuit breaker open after %s (%s)", backend.name, backend.url, kind, error)
            self._changed(backend.model)
