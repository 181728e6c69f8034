"""The facts the decision core works on, and the decisions it returns.

The core never sees raw text: the live gateway turns a request into ``RequestFacts`` (with a
fingerprint over the rendered prompt); the simulator builds the same type from workload block ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Fingerprint = tuple[tuple[int, int], ...]
"""Chained block hashes of a prompt, each with the number of tokens the block covers."""


@dataclass(frozen=True, slots=True)
class RequestFacts:
    rid: str
    model: str
    team: str = "default"
    priority: int = 0
    stream: bool = True
    prompt_tokens: int = 0
    """Estimated prompt tokens (bytes times the learned tokens-per-byte ratio, live)."""
    max_output_tokens: int = 0
    """Expected output tokens (the request's max_tokens, clipped)."""
    fingerprint: Fingerprint = ()
    conversation: str | None = None
    """A stable id of the conversation when the caller knows one (the simulator does)."""
    exclude: frozenset[str] = field(default_factory=frozenset)
    """Backends this request must not go to (a retry after a connection failure)."""


@dataclass(frozen=True, slots=True)
class BackendView:
    """What the core knows about one backend, from the pool's health checks and load polls."""

    name: str
    healthy: bool = True
    kv_tokens: int = 0
    """``max_total_num_tokens`` per DP rank (0: unknown)."""
    dp_size: int = 1
    running: int = 0
    waiting: int = 0
    token_usage: float = 0.0
    context_tokens: int = 0
    """The model's context window (``max_model_len``; 0: unknown)."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    rid: str
    backend: str
    rank: int | None = None
    reason: str = "least_wait"
    scores: dict[str, float] = field(default_factory=dict)


RefusalCode = Literal["team_queue_full", "queue_timeout", "team_token_rate", "no_healthy_backend",
                      "context_length_exceeded", "team_request_tokens"]


@dataclass(frozen=True, slots=True)
class Refuse:
    rid: str
    code: RefusalCode
    message: str
    retry_after_s: float = 1.0
    status: int = 429


Decision = Dispatch | Refuse


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a dispatched request ended, as the core learns it."""

    ok: bool = True
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reached_backend: bool = True
    """False when the connection failed before any byte was sent (safe to retry elsewhere)."""
    refused: bool = False
    """The engine refused the request (a 4xx answer): it holds nothing there, its seat goes at once."""
