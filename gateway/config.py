"""Configuration: a YAML file (interfaces §6), environment variables, and quick-start flags.

Precedence, highest first: command-line flags, ``CACHEGATE_*`` environment variables, the file.
"""

from __future__ import annotations

import fnmatch
import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The pool's part of the configuration lives with the pool (backends/ sits below gateway/).
from backends.config import BackendConfig as BackendConfig
from backends.config import HealthConfig as HealthConfig
from backends.config import ModelConfig as ModelConfig
from backends.config import _Strict


class ListenConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class TeamConfig(_Strict):
    max_concurrency: int = Field(8, ge=0)
    max_queue: int = Field(32, ge=0)
    queue_timeout_s: float = Field(60.0, gt=0)
    weight: float = Field(1.0, gt=0)
    priority: int = 0
    tokens_per_minute: int | None = Field(None, ge=0)


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
    max_connections: int | None = Field(None, ge=1)
    """Upstream connections one worker may hold (default: derived, ``Config.upstream_connections``)."""
    sse_keepalive_s: float = Field(15.0, ge=0)
    """Send an SSE comment after this much upstream silence (0: never), so ingress idle timeouts hold."""


class OverloadConfig(_Strict):
    """When a worker sheds NEW requests (503 ``overloaded`` + ``Retry-After``); streams in flight go on."""

    max_lag_ms: float = Field(1000.0, gt=0)
    """Shed while the event loop runs this late on average over ``window_s`` (a task that sleeps
    ``interval_ms`` measures how late it wakes), so one slow tick alone sheds nothing."""
    interval_ms: float = Field(50.0, gt=0)
    window_s: float = Field(1.0, gt=0)
    hold_s: float = Field(1.0, ge=0)
    """A timeout up to this long after a tick later than ``max_lag_ms`` is not blamed on the backend."""
    max_inflight: int | None = Field(None, ge=1)
    """Requests on the client surfaces' routes one worker holds (waiting or relaying); beyond it new
    ones are shed."""
    retry_after_s: int = Field(1, ge=1)


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
    overload: OverloadConfig = Field(default_factory=OverloadConfig)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    workers: int = Field(1, ge=1)
    log_level: str = "info"
    aliases: dict[str, str] = Field(default_factory=dict)
    """Client model names or glob patterns (``claude-*``, ``gpt-*``) → a model of ``models``; exact
    names first, then patterns in the order given (``docs/clients.md`` lists each client's names)."""
    queue_open_after_s: float = Field(10.0, ge=0)
    """A streamed request still waiting in the queue after this long gets its 200 headers and
    keep-alives (SSE comments, or ``ping`` events on /v1/messages), so client idle timeouts hold;
    a refusal after that is one in-stream error event (0: never open early)."""
    access_log: Literal["text", "json", "off"] = "text"
    """One line per HTTP request on the logger ``cachegate.access``: key=value text, bare JSON, or none."""

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
        for name, target in self.aliases.items():
            if target not in self.models:
                raise ValueError(f"alias {name!r} names model {target!r}, which is not in 'models'")
        return self

    def resolve_model(self, name: str) -> str | None:
        """The model alias a client's model name means (itself, an alias, or a pattern), or None."""
        if name in self.models:
            return name
        if name in self.aliases:
            return self.aliases[name]
        for pattern, target in self.aliases.items():
            if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(name, pattern):
                return target
        return None

    def upstream_model(self, alias: str) -> str:
        return self.models[alias].upstream_model or alias

    def upstream_connections(self) -> int:
        """The upstream connection budget of one worker: the configured cap, else every request the
        team limits can admit at once (each holds one connection) plus a retry's worth per backend,
        so the pool never refuses a request admission let through. Limits raised at runtime (admin
        API) are not counted: set ``upstream.max_connections`` if you raise them far; past the budget a
        request waits ``connect_timeout_s`` for a connection, then gets 503 ``overloaded``."""
        if self.upstream.max_connections is not None:
            return self.upstream.max_connections
        backends = sum(len(m.backends) for m in self.models.values())
        return sum(t.max_concurrency for t in self.teams.values()) + 8 * max(1, backends)


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
    access_log: str | None = None


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
    access_log: str | None = None,
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
                       ("log_level", env.log_level), ("policy", env.policy), ("access_log", env.access_log)):
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
                       ("log_level", log_level), ("access_log", access_log)):
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
