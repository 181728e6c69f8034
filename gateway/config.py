"""Configuration: a YAML file (interfaces §6), environment variables, and quick-start flags.

Precedence, highest first: command-line flags, ``CACHEGATE_*`` environment variables, the file.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListenConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


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

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _name(self) -> BackendConfig:
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


class TeamConfig(_Strict):
    max_concurrency: int = Field(8, ge=0)
    max_queue: int = Field(32, ge=0)
    queue_timeout_s: float = Field(60.0, gt=0)
    weight: float = Field(1.0, gt=0)
    priority: int = 0
    tokens_per_minute: int | None = Field(None, ge=0)
    max_request_tokens: int | None = Field(None, ge=1)
    """Ceiling on one request's prompt + max_tokens (400 ``team_request_tokens`` past it)."""


class KeyConfig(_Strict):
    sha256: str
    team: str = "default"

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.lower()
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ValueError("sha256 must be 64 hex digits (the SHA-256 of the key)")
        return v


class TelemetryConfig(_Strict):
    otlp_endpoint: str | None = None
    otlp_headers: dict[str, str] = Field(default_factory=dict)
    """Headers sent with each OTLP export (e.g. a collector token); used with ``otlp_endpoint``."""
    service_name: str = "cachegate"
    sample_ratio: float = Field(1.0, ge=0, le=1)
    record_content: bool = False
    """Record prompt and completion text on spans (off: never recorded)."""


class UpstreamConfig(_Strict):
    connect_timeout_s: float = Field(3.0, gt=0)
    idle_timeout_s: float = Field(300.0, gt=0)
    """Longest silence between two chunks of a stream (or before a non-stream answer) before 504."""
    keepalive_expiry_s: float = Field(3.0, gt=0)
    """Below SGLang's uvicorn ``timeout_keep_alive=5`` so a pooled connection is never reused as it closes."""
    max_connections: int = Field(1000, ge=1)
    sse_keepalive_s: float = Field(15.0, ge=0)
    """Send an SSE comment after this much upstream silence (0: never), so ingress idle timeouts hold."""


class HealthConfig(_Strict):
    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(5.0, gt=0)
    load_interval_s: float = Field(1.0, gt=0)
    failures_to_eject: int = Field(2, ge=1)


class EndpointsConfig(_Strict):
    """Who may read the gateway's own endpoints (docs/reliability.md)."""

    require_key: bool = False
    """``/metrics``, ``/readyz`` details and ``/v1/models`` need a team key or the admin token
    (``/readyz`` without one still answers its status code, for load balancers)."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Serve ``/metrics`` on this port (same host) instead of the main one (e.g. open only to Prometheus)."""


class ServerConfig(_Strict):
    """Limits of the HTTP server in front of everything (gateway/httpserver.py)."""

    header_timeout_s: float = Field(10.0, gt=0)
    """A connection must send a request's complete headers within this time (from its first byte, or
    from connecting); else it is closed (408)."""
    body_timeout_s: float = Field(60.0, gt=0)
    """A request's whole body must arrive within this time of its headers."""
    body_idle_timeout_s: float = Field(15.0, gt=0)
    """Longest silence between two pieces of a body."""
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    """Request line plus headers; past it: 431 and the connection closes."""
    max_headers: int = Field(100, ge=8)
    """Header fields per request; past it: 431."""
    keep_alive_s: int = Field(75, ge=1)
    """Idle keep-alive connections close after this (above common load balancers' 60 s)."""
    limit_concurrency: int | None = Field(None, ge=1)
    """uvicorn's cap on connections plus tasks (503 past it); None: no cap (the header timeout bounds idle ones)."""
    backlog: int = Field(2048, ge=1)


class AdmissionConfig(_Strict):
    """Seat parameters of the ``gateway`` stack (policies/admission.py documents each)."""

    admit_water: float | None = Field(None, gt=0, le=1)
    high_water: float | None = Field(None, gt=0, le=1)
    quantum_s: float | None = Field(None, gt=0)
    rotate_on: Literal["waiter", "seat"] | None = None
    min_hold_s: float | None = Field(None, ge=0)
    idle_release_s: float | None = Field(None, gt=0)
    default_output: int | None = Field(None, ge=1)
    output_clip: int | None = Field(None, ge=1)


class Config(_Strict):
    listen: ListenConfig = Field(default_factory=ListenConfig)
    redis_url: str | None = None
    lease_ttl_s: float = Field(10.0, gt=0)
    """A team slot held by a replica that died comes back within this time."""
    policy: str = "gateway"
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    teams: dict[str, TeamConfig] = Field(default_factory=dict)
    keys: list[KeyConfig] = Field(default_factory=list)
    admin_token_env: str = "CACHEGATE_ADMIN_TOKEN"
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    endpoints: EndpointsConfig = Field(default_factory=EndpointsConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    workers: int = Field(1, ge=1)
    log_level: str = "info"

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        from policies import registry

        if v not in registry.names():
            raise ValueError(f"unknown policy '{v}'; known: {', '.join(registry.names())}")
        return v

    @model_validator(mode="after")
    def _defaults(self) -> Config:
        # Keys without a team (and every request when no keys are configured) are team "default".
        # Unless configured, it is capped only loosely: the backends' seats protect the engines.
        self.teams.setdefault("default", TeamConfig(max_concurrency=256, max_queue=1024, queue_timeout_s=300))
        for alias, model in self.models.items():
            if model.upstream_model is None:
                model.upstream_model = alias
        return self

    def upstream_model(self, alias: str) -> str:
        return self.models[alias].upstream_model or alias


class EnvSettings(BaseSettings):
    """The ``CACHEGATE_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="CACHEGATE_", extra="ignore")
    config: str | None = None
    redis_url: str | None = None
    host: str | None = None
    port: int | None = None
    workers: int | None = None
    log_level: str | None = None
    policy: str | None = None
    admin_token: str | None = None


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_config(
    path: str | Path | None = None,
    *,
    backends: list[str] | None = None,
    model: str | None = None,
    api_keys: list[str] | None = None,
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    redis_url: str | None = None,
    policy: str | None = None,
    log_level: str | None = None,
) -> Config:
    """Build the configuration from a file, the environment and quick-start flags.

    ``backends`` + ``model`` (``--backend URL``, ``--model ALIAS``) add a model whose upstream
    served name is the alias itself; ``api_keys`` items are ``KEY`` (team default) or ``KEY=TEAM``.
    """
    env = EnvSettings()
    path = path or env.config
    data: dict[str, Any] = {}
    if path:
        text = Path(path).read_text()
        loaded = yaml.safe_load(text)
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the top level must be a mapping")
        data = loaded or {}
    for key, value in (("redis_url", env.redis_url), ("workers", env.workers),
                       ("log_level", env.log_level), ("policy", env.policy)):
        if value is not None:
            data[key] = value
    listen = dict(data.get("listen") or {})
    if env.host is not None:
        listen["host"] = env.host
    if env.port is not None:
        listen["port"] = env.port
    if host is not None:
        listen["host"] = host
    if port is not None:
        listen["port"] = port
    data["listen"] = listen
    for key, value in (("redis_url", redis_url), ("workers", workers), ("policy", policy),
                       ("log_level", log_level)):
        if value is not None:
            data[key] = value
    if backends:
        if not model:
            raise ValueError("--backend needs --model ALIAS (the model name clients use)")
        models = dict(data.get("models") or {})
        entry = dict(models.get(model) or {})
        entry["backends"] = [*list(entry.get("backends") or []), *({"url": u} for u in backends)]
        models[model] = entry
        data["models"] = models
    elif model and model not in (data.get("models") or {}):
        raise ValueError(f"--model {model}: no backends (add --backend URL or a config file)")
    if api_keys:
        keys = list(data.get("keys") or [])
        for item in api_keys:
            key, _, team = item.partition("=")
            if not key:
                raise ValueError("--api-key needs a non-empty key")
            keys.append({"sha256": hash_key(key), "team": team or "default"})
        data["keys"] = keys
    return Config.model_validate(data)
