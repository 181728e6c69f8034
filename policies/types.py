"""The facts the decision core works on, and the decisions it returns.

The core never sees raw text: the live gateway turns a request into ``RequestFacts`` (with a
fingerprint over the rendered prompt); the simulator builds the same type from workload block ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Fingerprint = tuple[tuple[int, int], ...]
"""Chained block hashes of a prompt, each with the number of tokens the block covers."""

Slot = tuple[str, int | None]
"""One KV cache: (backend name, DP rank), the rank None for a backend without DP (as in ``Dispatch.rank``)."""


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
    max_running_requests: int = 0
    """SGLang's ``max_running_requests`` per DP rank (0: unknown, no limit)."""
    host_tokens: int = 0
    """Host-tier (HiCache) tokens per DP rank (0: none)."""
    reload_tokens_per_s: float = 0.0
    """Rate at which a host-tier hit is loaded back instead of recomputed (0: no host tier)."""
    context_tokens: int = 0
    """The model's context window (``max_model_len``; 0: unknown)."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    rid: str
    backend: str
    rank: int | None = None
    reason: str = "least_wait"
    scores: dict[str, float] = field(default_factory=dict)
    """What the router weighed (span attributes ``cachegate.route.score.*``)."""
    matched_tokens: int | None = None
    """Tokens of the prompt the router believes the chosen backend (rank) holds; None: unknown."""


def new_dispatch(
    rid: str, backend: str, rank: int | None, reason: str, scores: dict[str, float], matched_tokens: int | None
) -> Dispatch:
    """``Dispatch(rid, backend, rank, reason, scores, matched_tokens)``, built faster: the frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__`` (a call per field, once per
    request); this sets its slots directly. The same object (``Dispatch`` has no
    ``__post_init__``; the import checks its fields)."""
    d = _new_object(Dispatch)
    _set_rid(d, rid)
    _set_backend(d, backend)
    _set_rank(d, rank)
    _set_reason(d, reason)
    _set_scores(d, scores)
    _set_matched(d, matched_tokens)
    return d


_new_object = object.__new__
if tuple(Dispatch.__dataclass_fields__) != ("rid", "backend", "rank", "reason", "scores", "matched_tokens") or (
    "__post_init__" in Dispatch.__dict__
):
    raise TypeError("new_dispatch no longer matches Dispatch's fields: update it with them")
_set_rid, _set_backend, _set_rank, _set_reason, _set_scores, _set_matched = (
    Dispatch.__dict__[name].__set__ for name in Dispatch.__dataclass_fields__
)


RefusalCode = Literal[
    "team_queue_full",
    "queue_timeout",
    "team_token_rate",
    "no_healthy_backend",
    "context_length_exceeded",
    "team_request_tokens",
    "overloaded",
]
"""Why a request was refused: the ``code`` of the error body and the ``reason`` label of the refusal
metric (``gateway/observability/metrics.py`` takes its label values from here). ``team_queue_full``: the team's queue
is at ``max_queue``; ``queue_timeout``: waited past ``queue_timeout_s``; ``team_token_rate``: the
team's ``tokens_per_minute`` budget is spent; ``no_healthy_backend``: nowhere to send it (503);
``context_length_exceeded``: the prompt (or prompt + ``max_tokens``) is more than any backend can ever
hold or its context window (400, at once: it would block the seat queue); ``team_request_tokens``:
past the team's ``max_request_tokens`` (400); ``overloaded``: the worker sheds new requests (503,
``gateway/request/overload.py``; not a policy decision, counted with the others)."""


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
