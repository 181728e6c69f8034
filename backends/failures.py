"""Whose fault an upstream failure is: the backend's (it counts towards its circuit breaker) or the
gateway's own (it never does).

Only evidence from the backend counts: a refused or reset connection, a 5xx, a response that broke
off, a read timeout after the request was sent. What the gateway does to itself never counts: its
connection pool was full (``httpx.PoolTimeout``), or its event loop was lagging when a timeout fired
(a worker that falls behind sees every deadline pass; the backend may be fine). A connect timeout
is ambiguous (a lagging loop, a full accept queue, or a dead host): it counts only as a timeout
(by streak or rate, see policies/breaker.py), never as the instant trip a refused connection is.
"""

from __future__ import annotations

import httpx

CONNECT = "connect"
TIMEOUT = "timeout"
STATUS_5XX = "status_5xx"
STREAM_BROKEN = "stream_broken"
MALFORMED = "malformed"
"""A stream that ended in bytes that are not HTTP: counts as a broken stream."""


def backend_fault(exc: BaseException | None = None, status: int = 0, lagging: bool = False) -> str | None:
    """The breaker kind ``exc`` (or an answered ``status``) counts as, or None: not the backend's fault.

    ``lagging``: the worker's event loop was behind when this happened (gateway/request/overload.py).
    """
    if exc is None:
        return STATUS_5XX if status >= 500 else None
    if isinstance(exc, httpx.PoolTimeout):
        return None  # our own connection budget: the request never left the gateway
    if isinstance(exc, httpx.TimeoutException):
        return None if lagging else TIMEOUT
    if isinstance(exc, httpx.ConnectError):
        return CONNECT  # refused, unreachable, reset during the handshake: the backend is not there
    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return STREAM_BROKEN  # reset or closed after the request went out
    return None


def stream_fault(stream_error: str | None, lagging: bool = False) -> str | None:
    """The breaker kind of a relay that ended with ``stream_error`` (``timeout``, ``stream_broken``)."""
    if stream_error in (STREAM_BROKEN, MALFORMED):
        return STREAM_BROKEN
    if stream_error == TIMEOUT and not lagging:
        return TIMEOUT
    return None
