"""The ``server:`` and ``endpoints:`` sections of the config (``gateway/http/server.py``,
``gateway/observability/exposure.py``)."""

from __future__ import annotations

from pydantic import Field

from backends.config import _Strict


class EndpointsConfig(_Strict):
    """Who may read the gateway's own endpoints (docs/reliability.md)."""

    require_key: bool = False
    """``/metrics``, ``/readyz`` details and ``/v1/models`` need a team key or the admin token
    (``/readyz`` without one still answers its status code, for load balancers)."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Serve ``/metrics`` on this port (same host) instead of the main one (e.g. open only to Prometheus)."""


class ServerConfig(_Strict):
    """Limits of the HTTP server in front of everything (gateway/http/server.py)."""

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
    backlog: int = Field(8192, ge=1)
    """Connections the kernel holds until a worker accepts them (the kernel caps it at
    ``net.core.somaxconn``). A burst of new connections past it is dropped and retried by TCP after
    seconds, or reset: a few thousand streams opening at once while the workers are busy would overflow
    uvicorn's 2048 (docs/benchmarks.md, "The relay at scale", its 5,000-stream line)."""
