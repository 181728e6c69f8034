"""The pool's part of the configuration: backends per model alias, and how they are checked.

``gateway/config.py`` builds the whole service configuration from these types; the pool
(``backends/pool.py``) needs only ``PoolConfig``, so ``backends/`` never imports ``gateway/``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


SurfaceName = Literal["responses", "messages"]
SurfaceMode = Literal["passthrough", "translate", "auto"]
"""How a backend answers a client surface other than chat: ``passthrough`` (post the client's API to
the backend's own route), ``translate`` (post ``/v1/chat/completions`` and translate back), ``auto``
(passthrough when the backend's ``/openapi.json`` lists the route, else translate)."""


class KVEventsSource(_Strict):
    """Where a backend publishes SGLang's KV events (its ``--kv-events-config``): ``docs/kv-events.md``."""

    endpoint: str
    """The PUB address to connect to, ``tcp://host:port``; DP rank r publishes on ``port + r``."""
    replay_endpoint: str | None = None
    """The ROUTER replay address (rank r: ``port + r``); without it a lost message or a restart leaves the
    backend on the approximate index until the engine clears its cache."""
    topic: str = ""
    poll_s: float = Field(1.0, gt=0)
    """How often the replay endpoint is probed (continuity check; a dead publisher is found within one)."""
    tokenize_wait_s: float = Field(0.25, ge=0)
    """The longest a conversation new to this replica waits for the backend's ``/v1/tokenize`` before it
    is routed anyway (``gateway/kv_learn.py``); 0: never wait (learn after the turn only)."""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _tcp(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("tcp://"):
            raise ValueError(f"kv_events endpoints are tcp://host:port, got {v!r}")
        return v


class BackendConfig(_Strict):
    url: str
    name: str | None = None
    """Defaults to host:port of the url."""
    dp_size: int = Field(1, ge=1)
    """Data-parallel attention ranks behind this URL (SGLang ``--dp N --enable-dp-attention``)."""
    api_key: str | None = None
    """Key sent upstream as ``Authorization: Bearer`` (SGLang ``--api-key``); client keys never are."""
    api_key_env: str | None = None
    """Name of an environment variable holding the upstream key (preferred over ``api_key``)."""
    surfaces: dict[SurfaceName, SurfaceMode] = Field(default_factory=dict)
    """Per surface, overrides the model's ``surfaces`` (e.g. ``{responses: passthrough}``)."""
    host_tier_tokens: int = Field(0, ge=0)
    """HiCache host-tier tokens per DP rank (SGLang ``--enable-hierarchical-cache``: host memory over the
    KV bytes per token). SGLang does not report it, so admission only counts the tier when it is set here
    (with ``host_load_tokens_per_s``); 0: no host tier."""
    kv_events: KVEventsSource | None = None
    """Follow the backend's KV events: its prefix index becomes exact (``policies/kv_view.py``)."""
    host_load_tokens_per_s: float = Field(0.0, ge=0)
    """How fast a host-tier hit is loaded back to the GPU, tokens/s (host-to-GPU bandwidth over the KV
    bytes per token per GPU; ~1.4M on 8×B300 with fp8 KV); 0: no host tier."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _name(self) -> BackendConfig:
        if (self.host_tier_tokens > 0) != (self.host_load_tokens_per_s > 0):
            raise ValueError("host_tier_tokens and host_load_tokens_per_s are set together (a host tier needs both)")
        if not self.name:
            self.name = self.url.split("://", 1)[1].split("/", 1)[0]
        return self

    def upstream_key(self) -> str | None:
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or self.api_key
        return self.api_key


class ModelConfig(_Strict):
    upstream_model: str | None = None
    """The served model name upstream; defaults to the alias."""
    backends: list[BackendConfig] = Field(default_factory=list)
    surfaces: dict[SurfaceName, SurfaceMode] = Field(default_factory=dict)
    """Per surface, the mode of this model's backends (default ``translate``: ``docs/clients.md``)."""


class HealthConfig(_Strict):
    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(5.0, gt=0)
    load_interval_s: float = Field(1.0, gt=0)
    failures_to_eject: int = Field(2, ge=1)


class PoolConfig(Protocol):
    """What ``BackendPool`` reads from the configuration (``gateway.config.Config`` is one)."""

    @property
    def models(self) -> Mapping[str, ModelConfig]: ...

    @property
    def health(self) -> HealthConfig: ...

    @property
    def breaker(self) -> Mapping[str, Any]:
        """Keyword parameters of every backend's ``policies/breaker.py::Breaker``."""
        ...

    def upstream_model(self, alias: str) -> str: ...
