"""The pool of backends: health checks, info reads, load polls, capacity and circuit breakers.

Where each signal comes from is the backend's engine adapter's business (``backends/engines/``:
SGLang, vLLM, a signal-less OpenAI-compatible endpoint, or ``auto``, detected from what the server
answers and logged once); the schedule and the bookkeeping are the pool's.

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
from typing import Any, Protocol

import httpx

from backends.aio import cancel_and_wait
from backends.backend import DEFAULT_MODE as DEFAULT_MODE
from backends.backend import Backend as Backend
from backends.config import PoolConfig
from backends.engines import Fetch, Info, Load, detect, make
from backends.engines.base import READ_ERRORS
from backends.engines.base import Reply as Reply
from backends.engines.detect import Undetected
from backends.engines.sglang import parse_loads
from policies.adaptive_limit import GradientLimit, normalised
from policies.breaker import Breaker
from policies.types import BackendView

log = logging.getLogger("cachegate.pool")


Listener = Callable[[str, list[BackendView]], None]


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
        ``gateway.http.wire_pool.WireClient`` of their own; by default one of httpx)."""
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
                    b.upstream_model or config.upstream_model(alias),
                    model_surfaces={str(k): str(v) for k, v in model.surfaces.items()},
                    breaker=Breaker(**config.breaker),
                    clock=clock,
                    host_tokens=b.host_tier_tokens,  # SGLang does not report its host tier: configured
                    reload_tokens_per_s=b.host_load_tokens_per_s,
                    adapter=make(b.engine),
                    max_total_num_tokens=b.kv_tokens,
                    capacity_source="configured" if b.kv_tokens else "",
                )
                for b in model.backends
            ]
            for alias, model in config.models.items()
        }
        for backend in self.all():
            if backend.engine == "openai" and not backend.config.kv_tokens:
                backend.limiter = GradientLimit()
                backend.max_running_requests = backend.limiter.seats()
                backend.capacity_source = "learned"
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
        partners are chosen at dispatch, gateway/request/pd_hop.py)."""
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

    def _fetcher(self, backend: Backend) -> Fetch:
        async def get(path: str) -> Reply:
            return await self._get(backend, path)

        return get

    async def _check(self, backend: Backend, first: bool = False) -> None:
        path = backend.adapter.health_path
        try:
            response = await self._get(backend, path)
            ok = response.status_code == 200
            error = "" if ok else f"{path} answered {response.status_code}"
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if ok:
            if not backend.info_fetched:
                await self._fetch_info(backend, check_models=first or not backend.served_models)
            self.mark_ok(backend)
        else:
            self.mark_failure(backend, error)

    async def _fetch_info(self, backend: Backend, check_models: bool) -> None:
        get = self._fetcher(backend)
        if isinstance(backend.adapter, Undetected):
            adapter, info, error = await detect(get)
            if adapter is not None:
                backend.adapter = adapter
                log.info("backend %s (%s): engine detected: %s", backend.name, backend.url, adapter.name)
        else:
            info, error = await backend.adapter.read_info(get)
        if error is None:
            self._apply_info(backend, info)
        else:
            backend.max_model_len = info.max_model_len or backend.max_model_len
            log.warning("backend %s: could not read %s: %s", backend.name, backend.adapter.info_route, error)
        await self._fetch_routes(backend)
        if check_models:
            await self._fetch_models(backend)

    @staticmethod
    def _apply_info(backend: Backend, info: Info) -> None:
        configured = backend.config.kv_tokens
        if configured:
            if info.kv_tokens and info.kv_tokens != configured:
                log.warning(
                    "backend %s: configured kv_tokens=%d, the server reports %d per rank (configured holds)",
                    backend.name,
                    configured,
                    info.kv_tokens,
                )
        elif info.kv_tokens or backend.limiter is None:  # a learned limit stays the source until then
            backend.max_total_num_tokens = info.kv_tokens
            backend.capacity_source = "reported" if info.kv_tokens else ""
        if backend.limiter is None:
            backend.max_running_requests = info.max_running_requests
        backend.reported_dp_size = info.dp_ranks
        if backend.reported_dp_size and backend.dp_size not in (1, backend.reported_dp_size):
            log.warning(
                "backend %s: configured dp_size=%d but the server reports dp_size=%d",
                backend.name,
                backend.dp_size,
                backend.reported_dp_size,
            )
        backend.max_model_len = info.max_model_len
        backend.info_fetched = True

    async def _fetch_models(self, backend: Backend) -> None:
        """``/v1/models``: the served names, and the model's context window (a request past it is refused at once)."""
        try:
            data = (await self._get(backend, "/v1/models")).json()
            listed = data.get("data") if isinstance(data, dict) else None
            if not isinstance(listed, list):
                raise ValueError(f"no model list in {str(data)[:200]!r}")
            cards = [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
            backend.served_models = [m["id"] for m in cards]
            for card in cards:
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
        except (httpx.HTTPError, ValueError, TypeError, AttributeError) as exc:
            log.warning("backend %s: could not read /v1/models: %s", backend.name, exc)

    async def _fetch_routes(self, backend: Backend) -> None:
        """The routes served (``/openapi.json``), for surfaces in ``auto`` mode."""
        try:
            response = await self._get(backend, "/openapi.json")
            paths = response.json().get("paths") if response.status_code == 200 else None
            backend.routes = frozenset(paths) if isinstance(paths, dict) else frozenset()
        except (httpx.HTTPError, ValueError, TypeError, AttributeError):
            backend.routes = frozenset()

    async def _poll_load(self, backend: Backend) -> None:
        try:
            load = await backend.adapter.read_load(self._fetcher(backend))
        except READ_ERRORS:
            return  # not answered (or not 200): nothing changed
        if load is not None:
            self._apply_load(backend, load)
        self._changed(backend.model)

    @staticmethod
    def _apply_loads(backend: Backend, data: dict[str, Any]) -> None:
        """An SGLang ``/v1/loads`` answer (the simulator feeds its engines' loads through here)."""
        load = parse_loads(data)
        if load is not None:
            BackendPool._apply_load(backend, load)

    @staticmethod
    def _apply_load(backend: Backend, load: Load) -> None:
        backend.running = load.running
        backend.waiting = load.waiting
        backend.token_usage = load.token_usage
        backend.cache_hit_rate = load.cache_hit_rate
        if load.kv_tokens and not backend.config.kv_tokens:
            backend.max_total_num_tokens = load.kv_tokens
            backend.capacity_source = "reported"
        backend.loads_at = backend.clock()

    def observe_latency(
        self, backend: Backend, ttft_s: float, prompt_tokens: int, cached_tokens: int, inflight: int
    ) -> None:
        """A streamed answer's time to first token from a backend whose limit is learned: the limiter
        (``policies/adaptive_limit.py``) moves, and admission hears of a new seat count."""
        limiter = backend.limiter
        if limiter is None:
            return
        before = limiter.seats()
        limiter.observe(normalised(ttft_s, prompt_tokens, cached_tokens), inflight, backend.clock())
        if limiter.seats() != before:
            backend.max_running_requests = limiter.seats()
            self._changed(backend.model)

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
