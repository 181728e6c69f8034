"""The live demo's twin profile: a B300-like contrast between a cached and a recomputed
turn, at the token scale a 2-core laptop can serve over HTTP.

``cachegate demo`` runs the ``coding-agent`` workload at token scale 0.032 (contexts of about
0.6k-8k tokens instead of 20k-250k) and think scale 0.25. On ``tiny`` a full recompute of such a
context costs a few hundred milliseconds, so nothing visibly collapses. This profile keeps the
scaled tokens but slows prefill so that time per token matches what a real node pays per *context*:

- prefill: ``t0`` 20 ms, ``r_lin`` 4,000 tokens/s, ``k_attn`` 6e-8 s per token·ctx: a cached turn
  (about 250 new tokens over a 5k context) costs about 0.15 s, a full 6k-token recompute about
  2.6 s (an 8×B300 node: 0.4 s and 12 s for a 160k context, §9.3 of the Kimi reference);
- decode: ``a`` 15 ms per step plus 0.1 µs per context token, so answers of 6-48 tokens take
  0.1-0.8 s;
- KV: 48,000 tokens per server, six times the longest conversation (an 8×B300 bf16 node holds about
  ten of its longest conversations), so two servers hold about 20 conversations of mean age (about
  4.5k tokens), each server alone about 10.

Not a hardware model: the constants are chosen, not derived, and the figures it produces are the
demo's, never the calibration's.
"""

from __future__ import annotations

from typing import Any

DEMO_PROFILE = "demo"

DEMO_FIELDS: dict[str, Any] = dict(
    name=DEMO_PROFILE,
    kv_tokens=48_000,
    page_size=16,
    chunked_prefill_size=2048,
    max_prefill_tokens=4096,
    max_running_requests=64,
    context_length=32768,
    dp_size=1,
    t0=0.02,
    r_lin=4_000.0,
    k_attn=6e-8,
    prefill_efficiency=1.0,
    a=0.015,
    t_experts=0.004,
    b=2e-5,
    b_cap=64,
    k_kv=1e-7,
    doc=__doc__ or "",
)
"""``backends.sim.profiles.Profile``'s fields for the demo profile (plain data: ``profiles.py`` imports
this module, so it does not import ``profiles.py`` back)."""
