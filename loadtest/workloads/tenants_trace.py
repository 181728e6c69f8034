"""A many-tenant shared-prefix workload as a Mooncake-format trace (``--workload trace:PATH``).

llm-d's precise-prefix benchmark shape: ``tenants`` groups (150), each with its own system prompt of
``prefix_tokens`` (6,000, rounded up to whole 512-token trace blocks: 6,144), a unique question of
U(0.8, 1.2) × ``question_tokens`` (1,200) and ``output_tokens`` (1,000) of answer; requests arrive as a
Poisson process at ``rate`` per second, each from a tenant drawn uniformly. Seeded: the same seed
writes the same file.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from loadtest.workloads.core import TRACE_BLOCK_TOKENS


def write_tenants_trace(
    path: Path,
    *,
    seed: int = 1,
    tenants: int = 150,
    prefix_tokens: int = 6000,
    question_tokens: int = 1200,
    output_tokens: int = 1000,
    rate: float = 4.0,
    minutes: float = 20.0,
) -> Path:
    rng = random.Random(f"tenants/{seed}")
    prefix_blocks = -(-prefix_tokens // TRACE_BLOCK_TOKENS)
    next_id = tenants * prefix_blocks
    t = 0.0
    lines: list[bytes] = []
    while True:
        t += rng.expovariate(rate)
        if t > minutes * 60:
            break
        tenant = rng.randrange(tenants)
        q = max(1, round(question_tokens * rng.uniform(0.8, 1.2)))
        q_blocks = -(-q // TRACE_BLOCK_TOKENS)
        ids = [tenant * prefix_blocks + j for j in range(prefix_blocks)] + list(range(next_id, next_id + q_blocks))
        next_id += q_blocks
        row = {
            "timestamp": round(t * 1000),
            "input_length": prefix_blocks * TRACE_BLOCK_TOKENS + q,
            "output_length": output_tokens,
            "hash_ids": ids,
        }
        lines.append(orjson.dumps(row))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
