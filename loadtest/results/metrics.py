"""The figures of a run, from per-request records, shared by the simulator and the live client.

Definitions (those of the published comparison the benchmark tables follow, docs/benchmarks.md):

* A request *completes* in the window ``[start, end)`` when its last token arrives there. Token
  rates count the prompt (cached included) plus the output of completed requests, per minute.
* TTFT samples: every request whose first token came in the window, plus every request still
  waiting for its first token at ``end`` (its wait so far), so starvation cannot hide.
  ``max_wait_s`` is the largest of those samples.
* ``output_tps_p50``: median over completed requests of ``(output - 1) / (finish - first token)``.
* ``cache_hit_rate``: cached prompt tokens over prompt tokens of completed requests.
* ``load_imbalance``: the busiest backend's served tokens (prompt + output of its completed
  requests) over the mean across backends (1.0 = perfectly even).
* ``starved``: conversation slots (closed loop) that completed no request in the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class RequestRecord:
    rid: str
    team: str = "default"
    slot: int | None = None
    """Closed-loop conversation slot (None for open-loop requests)."""
    backend: str | None = None
    arrival: float = 0.0
    """When the client sent it."""
    first_token: float | None = None
    finish: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ok: bool = True
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); None when empty."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def ttft_samples(records: Iterable[RequestRecord], start: float, end: float) -> list[float]:
    samples: list[float] = []
    for r in records:
        if r.first_token is not None:
            if start <= r.first_token < end:
                samples.append(r.first_token - r.arrival)
        elif r.error is None and r.arrival < end:
            samples.append(end - r.arrival)  # still waiting when the run ended
    return samples


def summarize(
    records: Sequence[RequestRecord],
    start: float,
    end: float,
    *,
    slots: dict[int, str] | None = None,
    backends: Sequence[str] = (),
) -> dict:
    """Run-level figures over ``[start, end)`` (seconds); ``slots`` maps slot -> team."""
    minutes = max(1e-9, (end - start) / 60.0)
    done = [r for r in records if r.finish is not None and r.ok and start <= r.finish < end]
    inp = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    out = sum(r.output_tokens for r in done)
    ttfts = ttft_samples(records, start, end)
    speeds = [
        (r.output_tokens - 1) / (r.finish - r.first_token)
        for r in done
        if r.first_token is not None and r.output_tokens > 1 and r.finish > r.first_token
    ]
    errors = sum(1 for r in records if r.error is not None and start <= (r.finish or r.arrival) < end)
    served: dict[str, int] = dict.fromkeys(backends, 0)
    for r in done:
        if r.backend is not None:
            served[r.backend] = served.get(r.backend, 0) + r.prompt_tokens + r.output_tokens
    mean = sum(served.values()) / len(served) if served else 0
    row = {
        "total_tpm": round((inp + out) / minutes),
        "input_tpm": round(inp / minutes),
        "cached_tpm": round(cached / minutes),
        "output_tpm": round(out / minutes),
        "completed_rpm": _r(len(done) / minutes, 2),
        "ttft_p50_s": _r(percentile(ttfts, 50)),
        "ttft_p95_s": _r(percentile(ttfts, 95)),
        "output_tps_p50": _r(percentile(speeds, 50), 2),
        "cache_hit_rate": _r(cached / inp if inp else None, 4),
        "load_imbalance": _r(max(served.values()) / mean if mean else None, 3),
        "errors": errors,
        "max_wait_s": _r(max(ttfts) if ttfts else None),
        "starved": 0,
    }
    if slots is not None:
        finished_slots = {r.slot for r in done}
        row["starved"] = sum(1 for s in slots if s not in finished_slots)
    return row


def team_rows(
    records: Sequence[RequestRecord], start: float, end: float, team_sizes: dict[str, int]
) -> dict[str, dict]:
    """Per-team ``{conversations, completed_rpm, ttft_p50_s, ttft_p95_s, total_tpm}``."""
    teams: dict[str, dict] = {}
    for team, size in team_sizes.items():
        mine = [r for r in records if r.team == team]
        row = summarize(mine, start, end)
        teams[team] = {
            "conversations": size,
            "completed_rpm": row["completed_rpm"],
            "ttft_p50_s": row["ttft_p50_s"],
            "ttft_p95_s": row["ttft_p95_s"],
            "total_tpm": row["total_tpm"],
        }
    return teams
