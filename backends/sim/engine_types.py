"""The simulated engine's public records: requests in, events out, counters and per-rank loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from backends.sim.tokenizer import Block, chain_key

UNBOUNDED_TOKENS = 10**12
"""``max_total_num_tokens`` of an ``unbounded`` engine: a pool that never evicts."""

STUCK_MESSAGE = "request cannot be admitted even into an empty batch"
"""Message of the abort that keeps a rank from idling with a request it can never admit."""


def default_output_block(prompt: list[Block], rid: str, ntok: int) -> Block:
    """The block a finished request with ``final_blocks=None`` inserts for its output.

    It holds ``output_tokens - 1`` tokens (the last output token has no KV). A caller that builds
    the next turn's prompt as ``prompt + [this block] + new blocks`` keeps the whole history
    matchable.
    """
    last = prompt[-1][0] if prompt else 0
    return (chain_key(last, b"output:" + rid.encode()), ntok)


@dataclass(slots=True)
class EngineRequest:
    rid: str
    prompt: list[Block]
    """Prompt blocks with chained keys; their token counts sum to the prompt length."""
    output_tokens: int
    """Tokens this request will generate before it finishes (the twin decides from max_tokens)."""
    max_new_tokens: int
    """What admission reserves for (SGLang clips the estimate at 4096)."""
    final_blocks: list[Block] | None = None
    """Blocks of prompt + output, inserted into the cache when the request finishes. None: the
    prompt blocks plus one block unique to this rid for the output."""
    dp_rank: int | None = None
    """Pinned DP rank (``routed_dp_rank``); None: the server's own round-robin."""

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.prompt)


@dataclass(frozen=True, slots=True)
class EngineEvent:
    kind: Literal["first_token", "finished"]
    rid: str
    time: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the cache at the (last) admission of this request."""
    finish_reason: Literal["length", "stop", "abort"] | None = None
    retractions: int = 0
    rank: int = 0
    message: str = ""


@dataclass(slots=True)
class EngineCounters:
    """Monotone totals, as SGLang's ``sglang:*_total`` counters."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    prefill_compute_tokens: int = 0
    prefill_cache_tokens: int = 0
    host_load_tokens: int = 0
    retractions: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    evicted_tokens: int = 0


@dataclass(slots=True)
class RankLoad:
    """One rank's point-in-time state, as ``/v1/loads`` reports it."""

    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    token_usage: float
    cache_hit_rate: float
    gen_throughput: float
    max_running_requests: int
    extra: dict[str, float] = field(default_factory=dict)
