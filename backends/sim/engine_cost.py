"""The engine's cost model: how long one prefill batch or one decode step takes on a profile.

Prefill ``(t0 + Σu/r_lin + k_attn·Σu·(c + u/2) + k_kvb·Σc) / efficiency`` plus host loads; decode
``a + t_experts·coverage(B) + b·min(B, b_cap) + k_kv·Σctx`` (per output token with speculative
decoding). The constants and their derivations: ``profiles.py``.
"""

from __future__ import annotations

from backends.sim.engine_state import RankState, ReqState
from backends.sim.profile_model import Profile


def decode_shared_time(p: Profile, decoding: int) -> float:
    """The part of a decode step every rank pays: fixed overhead and the routed-expert stream.

    Coverage counts the tokens a pipeline stage sees per micro-batch: B/pp once there are at
    least pp requests, else one request at a time through every stage. With speculative
    decoding a verify step carries d + 1 tokens per request and the draft passes add d × the
    draft overhead × ``a``."""
    q = 1 + p.spec_draft_tokens
    per_stage = max(decoding / p.pp, 1.0) * q
    cov = 1.0 - (1.0 - p.experts_per_token / p.num_experts) ** per_stage
    return float(p.a * (1.0 + p.spec_draft_overhead * p.spec_draft_tokens) + p.t_experts * cov)


def decode_rank_time(p: Profile, rk: RankState, shared: float) -> float:
    """One rank's decode step: ``shared`` plus its requests' linear compute and KV reads, per
    output token (a verify step yields ``spec_accept_length`` tokens per request)."""
    b = len(rk.running)
    q = 1 + p.spec_draft_tokens
    kv = p.k_kv * rk.ctx_sum * p.pp / min(b, p.pp) * (p.spec_kv_factor if p.spec_draft_tokens else 1.0)
    t = shared + p.b * min(b * q, p.b_cap) + kv
    return t / p.spec_accept_length


def prefill_time(p: Profile, items: list[tuple[ReqState, int, int]]) -> float:
    base, attn = prefill_parts(p, items)
    return base + attn


def prefill_parts(p: Profile, items: list[tuple[ReqState, int, int]]) -> tuple[float, float]:
    """(linear + fixed + host-load time, attention time) of one rank's prefill batch. The
    attention part includes the per-chunk ``kv_b_proj`` re-expansion of each item's prefix."""
    u_sum = 0
    attn = 0.0
    prefix = 0
    host = 0
    for _, u, c in items:
        if u < 0:  # host-tier load marker
            host += -u
            continue
        u_sum += u
        attn += u * (c + u / 2)
        prefix += c
    base = (p.t0 + u_sum / p.r_lin) / p.prefill_efficiency
    if host:
        base += host / p.host_load_tokens_per_s
    return base, (p.k_attn * attn + p.k_kvb * prefix) / p.prefill_efficiency
