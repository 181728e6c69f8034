"""The pool's part of the configuration: backends per model alias, and how they are checked.

``gateway/config/schema.py`` builds the whole service configuration from these types; the pool
(``backends/pool.py``) needs only ``PoolConfig``, so ``backends/`` never imports ``gateway/``.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterable, Mapping
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


EngineName = Literal["sglang", "vllm", "openai", "auto"]
"""A backend's engine dialect (``backends/engines/``, ``docs/engines.md``): ``auto`` detects it from what
the server answers."""
SurfaceName = Literal["responses", "messages"]
Role = Literal["prefill", "decode"]
"""A backend's part in a prefill/decode-disaggregated pool (SGLang ``--disaggregation-mode``)."""
DEFAULT_BOOTSTRAP_PORT = 8998
"""SGLang 0.5.23's ``--disaggregation-bootstrap-port`` default (the ``--prefill URL`` flag's)."""
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
    is routed anyway (``gateway/state/kv_learn.py``); 0: never wait (learn after the turn only)."""

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
    engine: EngineName = "auto"
    """Which engine serves this URL: what the pool reads from it and how a DP rank is pinned."""
    dp_size: int = Field(1, ge=1)
    """Data-parallel ranks behind this URL (SGLang ``--dp N --enable-dp-attention``; vLLM
    ``--data-parallel-size N`` with its internal load balancing; with vLLM's external load balancing,
    one backend per rank's port instead)."""
    kv_tokens: int = Field(0, ge=0)
    """KV tokens per DP rank, for an engine that does not report them (``engine: openai``); when set it
    wins over the reported figure (0: use what the engine reports)."""
    upstream_model: str | None = None
    """The model's served name on this backend (a hosted endpoint's own name for it); default: the
    model's ``upstream_model``."""
    api_key: str | None = None
    """Key sent upstream as ``Authorization: Bearer`` (SGLang ``--api-key``); client keys never are."""
    api_key_env: str | None = None
    """Name of an environment variable holding the upstream key (preferred over ``api_key``). The key
    goes in the upstream request's ``Authorization`` header and nowhere else: never logged, never in
    metrics, traces or error bodies."""
    tls_ca_file: str | None = None
    """For an ``https://`` backend: a PEM file of the certificate authorities its certificate is verified
    against, instead of the system's trust store (a private CA); the host name is always checked."""
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
    role: Role | None = None
    """``prefill`` or ``decode`` in a disaggregated pool (docs/disaggregation.md); None: co-located."""
    bootstrap_port: int | None = Field(None, ge=1, le=65535)
    """A prefill backend's ``--disaggregation-bootstrap-port`` (the decode node fetches the KV there)."""

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"backend url must start with http:// or https://, got {v!r}")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _name(self) -> BackendConfig:
        if self.engine == "openai" and self.dp_size > 1:
            raise ValueError("engine: openai has no DP ranks to address (dp_size must be 1)")
        if (self.host_tier_tokens > 0) != (self.host_load_tokens_per_s > 0):
            raise ValueError("host_tier_tokens and host_load_tokens_per_s are set together (a host tier needs both)")
        if self.role == "prefill" and self.bootstrap_port is None:
            raise ValueError(f"backend {self.url}: role prefill needs bootstrap_port (SGLang's default is 8998)")
        if self.bootstrap_port is not None and self.role != "prefill":
            raise ValueError(f"backend {self.url}: bootstrap_port is for role: prefill backends only")
        if self.tls_ca_file is not None:
            if not self.url.startswith("https://"):
                raise ValueError(f"backend {self.url}: tls_ca_file is for https:// backends only")
            try:
                ssl.create_default_context(cafile=self.tls_ca_file)
            except (OSError, ssl.SSLError) as exc:
                msg = f"backend {self.url}: tls_ca_file {self.tls_ca_file!r}: not a PEM CA file ({exc})"
                raise ValueError(msg) from None
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

    @model_validator(mode="after")
    def _roles(self) -> ModelConfig:
        roles = {b.role for b in self.backends}
        if roles & {"prefill", "decode"}:
            if None in roles:
                raise ValueError("a disaggregated model's backends each need role: prefill or role: decode")
            if "decode" not in roles:
                raise ValueError("a model with prefill backends needs decode backends (role: decode)")
            if "prefill" not in roles:
                raise ValueError("a model with decode backends needs prefill backends (role: prefill)")
        return self

    @property
    def disaggregated(self) -> bool:
        return any(b.role is not None for b in self.backends)


def tls_trust(models: Iterable[ModelConfig]) -> dict[tuple[str, int], str]:
    """(host, port) → ``tls_ca_file`` of every ``https://`` backend that names one (the upstream client's
    ``trust``)."""
    out: dict[tuple[str, int], str] = {}
    for model in models:
        for b in model.backends:
            if b.tls_ca_file is not None:
                parts = urlsplit(b.url)
                out[(parts.hostname or "", parts.port or 443)] = b.tls_ca_file
    return out


def pd_backends(prefill: list[str], decode: list[str]) -> list[dict[str, Any]]:
    """``--prefill URL[:BOOTSTRAP_PORT]`` and ``--decode URL`` flags → backend entries. A prefill URL
    with a second port after its own (``http://10.0.0.5:30000:8998``) names its bootstrap port, else
    SGLang's default 8998."""
    out: list[dict[str, Any]] = []
    for item in prefill:
        url, port = _bootstrap_port(item)
        out.append({"url": url, "role": "prefill", "bootstrap_port": port})
    out.extend({"url": url, "role": "decode"} for url in decode)
    return out


def _bootstrap_port(item: str) -> tuple[str, int]:
    """``scheme://host:port:bootstrap[/path]`` → (URL without the bootstrap port, it); else (item, 8998).
    The host may be an IPv6 literal in brackets, whose own colons are not ports."""
    scheme, sep, rest = item.partition("://")
    authority, slash, path = rest.partition("/")
    if authority.startswith("["):
        end = authority.find("]") + 1
        host, ports = authority[:end], authority[end:]
    else:
        host, colon, after = authority.partition(":")
        ports = colon + after
    numbers = ports.split(":")[1:]
    if sep and len(numbers) == 2 and all(n.isdigit() for n in numbers):
        return f"{scheme}://{host}:{numbers[0]}{slash}{path}", int(numbers[1])
    return item, DEFAULT_BOOTSTRAP_PORT


class HealthConfig(_Strict):
    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(5.0, gt=0)
    load_interval_s: float = Field(1.0, gt=0)
    failures_to_eject: int = Field(2, ge=1)


class PoolConfig(Protocol):
    """What ``BackendPool`` reads from the configuration (``gateway.config.schema.Config`` is one)."""

    @property
    def models(self) -> Mapping[str, ModelConfig]: ...

    @property
    def health(self) -> HealthConfig: ...

    @property
    def breaker(self) -> Mapping[str, Any]:
        """Keyword parameters of every backend's ``policies/breaker.py::Breaker``."""
        ...

    def upstream_model(self, alias: str) -> str: ...
