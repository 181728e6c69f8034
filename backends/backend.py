"""One backend as the pool knows it: its configuration, its engine adapter, and what its health
checks, info reads and load polls last said (``backends/pool.py`` keeps it current)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from backends.config import BackendConfig
from backends.engines import EngineAdapter
from backends.engines.detect import Undetected
from policies.adaptive_limit import GradientLimit
from policies.breaker import STATE_CODE, Breaker
from policies.types import BackendView

DEFAULT_MODE = "translate"
"""Responses and Messages are translated to chat unless configured otherwise (``docs/clients.md``)."""
CapacitySource = Literal["", "reported", "configured", "learned"]
"""Where a backend's KV capacity came from: its engine's own report, the config's ``kv_tokens``, or
learned from what the gateway observed ("": unknown)."""


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
    adapter: EngineAdapter = field(default_factory=Undetected)
    """The engine's dialect (``engine: auto`` starts undetected: ``backends/engines/detect.py``)."""
    capacity_source: CapacitySource = ""
    limiter: GradientLimit | None = None
    """The capacity learned from latency of an endpoint that publishes no signals (``engine: openai``
    without a configured ``kv_tokens``): ``max_total_num_tokens`` when learned."""
    inflight: int = 0
    """Requests sent to it and not yet answered (counted only where a limiter learns from them)."""

    @property
    def engine(self) -> str:
        """``sglang``, ``vllm``, ``openai``, or ``auto`` while undetected."""
        return self.adapter.name

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
