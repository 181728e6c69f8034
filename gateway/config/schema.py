"""Configuration: a YAML file (``deploy/cachegate.example.yaml`` shows every section), environment
variables, and quick-start flags.

Precedence, highest first: command-line flags, ``CACHEGATE_*`` environment variables, the file.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

# The pool's part of the configuration lives with the pool (backends/ sits below gateway/).
from backends.config import BackendConfig as BackendConfig
from backends.config import HealthConfig as HealthConfig
from backends.config import ModelConfig as ModelConfig
from backends.config import _Strict
from gateway.config.params import check_section, section_model
from gateway.config.server import EndpointsConfig as EndpointsConfig
from gateway.config.server import ServerConfig as ServerConfig
from policies.admission import SeatParams
from policies.breaker import Breaker
from policies.routers.min_ttft import MinTTFT
from policies.teams import TeamLimits


class ListenConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


_TEAM = TeamLimits()


class TeamConfig(_Strict):
    """A team's limits as a config file gives them: the fields, defaults and meanings of
    ``policies/teams.py::TeamLimits`` (a test keeps the two equal), with the bounds a file must respect."""

    max_concurrency: int = Field(_TEAM.max_concurrency, ge=0)
    max_queue: int = Field(_TEAM.max_queue, ge=0)
    queue_timeout_s: float = Field(_TEAM.queue_timeout_s, gt=0)
    weight: float = Field(_TEAM.weight, gt=0)
    priority: int = _TEAM.priority
    tokens_per_minute: int | None = Field(_TEAM.tokens_per_minute, ge=0)
    max_request_tokens: int | None = Field(_TEAM.max_request_tokens, ge=1)
    max_wait_s: float = Field(_TEAM.max_wait_s, gt=0)

    def limits(self) -> TeamLimits:
        return TeamLimits(**self.model_dump())


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
    prefill_timeout_s: float = Field(60.0, gt=0)
    """A disaggregated turn: longest wait for its prefill leg to hand the KV over (the prefill's answer or
    the decode leg's first byte) before both legs are closed and another prefill partner is tried
    (docs/disaggregation.md)."""


# Policy parameters: each section's fields are the policy's own (names, types, defaults: see
# gateway/config/params.py); only their bounds are here. Unset entries keep the policy's default.
AdmissionSection = section_model(
    SeatParams,
    "AdmissionSection",
    {
        "admit_water": {"gt": 0, "le": 1},
        "high_water": {"gt": 0, "le": 1},
        "quantum_s": {"gt": 0},
        "min_hold_s": {"ge": 0},
        "idle_release_s": {"gt": 0},
        "default_output": {"ge": 1},
        "output_clip": {"ge": 1},
        "rotate_on": {"pattern": "^(waiter|seat)$"},
        "rotate_by": {"pattern": "^(lend|evict)$"},
        "kv_overbook": {"ge": 0.5, "le": 2},
        "wait_lead_s": {"ge": 0},
        "cap_patience_s": {"ge": 0},
        "cap_queue_s": {"ge": 0},
    },
)
"""``admission:``: ``policies/admission/params.py::SeatParams`` (the ``gateway`` stack's seats)."""
RouterSection = section_model(
    MinTTFT,
    "RouterSection",
    {
        "tie_rel": {"ge": 0},
        "tie_abs_s": {"ge": 0},
        "gate_ratio": {"ge": 1},
        "gate_slack": {"ge": 0},
        "gate_move_s": {"gt": 0},
        "gate_max": {"ge": 1},
        "stay": {"ge": 0},
        "solo_share": {"ge": 0},
        "load_factor": {"ge": 1},
        "learn_alpha": {"gt": 0, "le": 1},
        "default_capacity": {"ge": 1},
    },
)
"""``router:``: keyword parameters of ``policies/routers/min_ttft.py::MinTTFT`` (the ``gateway`` stack's router)."""
BreakerSection = section_model(
    Breaker,
    "BreakerSection",
    {
        "consecutive_failures": {"ge": 1},
        "error_rate": {"gt": 0, "le": 1},
        "window": {"ge": 1},
        "min_samples": {"ge": 1},
        "open_s": {"gt": 0},
        "max_open_s": {"gt": 0},
    },
)
"""``breaker:``: keyword parameters of ``policies/breaker.py::Breaker`` (one per backend)."""


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


class Config(_Strict):
    listen: ListenConfig = Field(default_factory=ListenConfig)
    redis_url: str | None = None
    lease_ttl_s: float = Field(10.0, gt=0)
    """A team lease held by a replica that died comes back within this time."""
    policy: str = "gateway"
    admission: dict[str, Any] = Field(default_factory=dict)
    """Seat parameters (``AdmissionSection``); used by stacks with seats."""
    router: dict[str, Any] = Field(default_factory=dict)
    """Router parameters (``RouterSection``); used by stacks whose router is ``min-ttft``."""
    breaker: dict[str, Any] = Field(default_factory=dict)
    """Circuit-breaker parameters (``BreakerSection``), the same for every backend."""
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    teams: dict[str, TeamConfig] = Field(default_factory=dict)
    keys: list[KeyConfig] = Field(default_factory=list)
    admin_token_env: str = "CACHEGATE_ADMIN_TOKEN"
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    upstream: UpstreamConfig = Field(default_factory=UpstreamConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    overload: OverloadConfig = Field(default_factory=OverloadConfig)
    endpoints: EndpointsConfig = Field(default_factory=EndpointsConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    workers: int | None = Field(None, ge=1)
    """Worker processes; unset: one per core available to the process with ``redis_url``, else 1."""
    log_level: str = "info"
    aliases: dict[str, str] = Field(default_factory=dict)
    """Client model names or glob patterns (``claude-*``, ``gpt-*``) → a model of ``models``; exact
    names first, then patterns in the order given (``docs/clients.md`` lists each client's names)."""
    queue_open_after_s: float = Field(10.0, ge=0)
    """A streamed request still waiting in the queue after this long gets its 200 headers and
    keep-alives (SSE comments, or ``ping`` events on /v1/messages), so client idle timeouts hold;
    a refusal after that is one in-stream error event (0: never open early)."""
    access_log: Literal["text", "json", "off"] = "text"
    """One line per HTTP request on stderr (``gateway/observability/access.py``): key=value text, bare JSON, or none."""

    @field_validator("admission")
    @classmethod
    def _admission(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_section(AdmissionSection, v)

    @field_validator("router")
    @classmethod
    def _router(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_section(RouterSection, v)

    @field_validator("breaker")
    @classmethod
    def _breaker(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_section(BreakerSection, v)

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

    def worker_count(self) -> int:
        """``workers``, or its default: one worker per core when Redis is configured (the workers of a
        replica share team limits through it), one otherwise."""
        if self.workers:
            return self.workers
        return len(os.sched_getaffinity(0)) if self.redis_url else 1

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


class _ListenEnv(PydanticBaseSettingsSource):
    """``CACHEGATE_HOST`` / ``CACHEGATE_PORT``: the short names of ``listen.host`` / ``listen.port``."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ answers for the whole section

    def __call__(self) -> dict[str, Any]:
        listen = {
            key: os.environ[f"CACHEGATE_{key.upper()}"]
            for key in ("host", "port")
            if f"CACHEGATE_{key.upper()}" in os.environ
        }
        return {"listen": listen} if listen else {}


class _Sourced(BaseSettings, Config):
    """``Config`` read from its sources by pydantic-settings, highest first: the flags (init
    arguments), ``CACHEGATE_HOST`` / ``CACHEGATE_PORT``, ``CACHEGATE_<FIELD>`` (e.g.
    ``CACHEGATE_REDIS_URL``, ``CACHEGATE_WORKERS``; nested with ``__``: ``CACHEGATE_LISTEN__PORT``),
    then the YAML file. Nested sections merge field by field."""

    model_config = SettingsConfigDict(env_prefix="CACHEGATE_", env_nested_delimiter="__", extra="forbid")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _ListenEnv(settings_cls), env_settings]
        if settings_cls.model_config.get("yaml_file"):
            sources.append(YamlConfigSettingsSource(settings_cls))
        return tuple(sources)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load_config(
    path: str | Path | None = None,
    *,
    backends: list[str | dict[str, Any]] | None = None,
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
    served name is the alias itself (an item may be a backend mapping: ``--prefill``/``--decode``,
    ``backends.config.pd_backends``); ``api_keys`` items are ``KEY`` (team default) or ``KEY=TEAM``.
    """
    path = path or os.environ.get("CACHEGATE_CONFIG") or None
    if path:
        loaded = yaml.safe_load(Path(path).read_text())
        if loaded is not None and not isinstance(loaded, dict):
            raise ValueError(f"{path}: the top level must be a mapping")
    flags: dict[str, Any] = {
        k: v
        for k, v in (
            ("redis_url", redis_url),
            ("workers", workers),
            ("policy", policy),
            ("log_level", log_level),
            ("access_log", access_log),
        )
        if v is not None
    }
    listen = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if listen:
        flags["listen"] = listen
    sourced = type("_FromFile", (_Sourced,), {"model_config": {**_Sourced.model_config, "yaml_file": path}})
    data = sourced(**flags).model_dump(exclude_unset=False)
    if backends:
        if not model:
            raise ValueError("--backend needs --model ALIAS (the model name clients use)")
        models = dict(data.get("models") or {})
        entry = dict(models.get(model) or {})
        entry["backends"] = [
            *list(entry.get("backends") or []),
            *({"url": u} if isinstance(u, str) else u for u in backends),
        ]
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
