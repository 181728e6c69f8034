"""One engine's dialect behind one interface: what the pool reads from a backend, and how a request
pins one of its data-parallel ranks.

The pool (``backends/pool.py``) owns the schedule (health checks, info reads, load polls) and the
``Backend`` record; an adapter only knows where an engine publishes each signal and how to parse it:

- ``health_path``: the route whose 200 means "in rotation";
- ``read_info``: context window, KV capacity per rank, DP ranks, running cap (read once, on the first
  passing health check, again at each check until it succeeds);
- ``read_load``: per-rank running/waiting requests, KV usage, prefix-cache hit rate (every poll);
- ``pin``: how a request addresses DP rank ``k`` (a body field, a header, or not at all);
- ``native_surfaces``: the client surfaces beyond chat and completions a server of this engine serves.

An adapter is made per backend (``adapters.make``): one that turns counters into rates keeps the
previous reading. Parsing is pure (``parse_*`` functions beside each adapter) so the tests feed the
engines' own payloads to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import httpx


class Reply(Protocol):
    """A whole answer to a GET (``httpx.Response`` and ``gateway.http.wire_pool.WireReply`` are ones)."""

    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...

    def json(self) -> Any: ...


Fetch = Callable[[str], Awaitable[Reply]]
"""GET a path of this backend (the pool's client, headers and timeout); raises httpx's errors."""

READ_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError)
"""What a read raises: the transport's httpx errors, and what a malformed answer raises while parsed."""


@dataclass(slots=True)
class Info:
    """What a backend says about itself once (0 / None: not said)."""

    kv_tokens: int = 0
    """KV tokens per DP rank (SGLang ``max_total_num_tokens``; vLLM ``num_gpu_blocks × block_size`` per engine)."""
    dp_ranks: int | None = None
    max_running_requests: int = 0
    """Requests one rank runs at once (SGLang ``max_running_requests``; 0: unknown)."""
    max_model_len: int = 0


@dataclass(slots=True)
class Load:
    """One poll of a backend's load, summed (or maxed) over its ranks."""

    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0
    """The fullest rank's KV usage, 0-1."""
    cache_hit_rate: float = 0.0
    kv_tokens: int = 0
    """KV tokens per rank when the poll carries them (0: keep what the pool has)."""
    ranks: int = 0


class EngineAdapter:
    """The interface the pool calls (the defaults are an engine that publishes nothing)."""

    name: ClassVar[str] = "none"
    health_path: ClassVar[str] = "/health"
    native_surfaces: ClassVar[frozenset[str]] = frozenset()
    info_route: ClassVar[str] = ""
    """The route ``read_info`` reads first (named in the pool's warning when it cannot)."""

    async def read_info(self, get: Fetch) -> tuple[Info, str | None]:
        """The backend's self-description, and None when it was read, else why not (then it is read
        again at the next check; the partial ``Info`` still carries what could be read)."""
        return Info(), "the engine publishes no self-description"

    async def read_load(self, get: Fetch) -> Load | None:
        """One load poll (None: nothing to apply)."""
        return None

    def pin(self, rank: int | None) -> tuple[int | None, dict[str, str]]:
        """``(rank for the body's routed_dp_rank field, headers)`` that send a request to ``rank``."""
        return rank, {}
