"""``mooncake-synth`` (held out): a Mooncake-format trace synthesised from the published statistics of
Kimi's conversation trace, not copied from it (Qin et al., "Mooncake", FAST'25; the FAST25-release
conversation trace's figures as ``reference/peers.md`` §5.1 lists them):

* 3.40 requests/s, Poisson;
* input length log-normal with median 6,909 and mean 12,035 tokens (sigma = sqrt(2 ln(mean /
  median)) = 1.05, which puts the p95 at 39k against the published 39,550), capped at 126k;
* output length normal with mean 343 and p95 698 (sigma 216), at least 1;
* every request starts with the same block (id 0: the published trace has one distinct first block);
* 38.7% of requests continue an earlier one (their first two blocks were seen before): a follow-up
  resends the whole prompt of a recent request of its session and adds its own tokens, so the
  infinite-cache prefix hit rate lands near the published 36.6%.

A follow-up continues, among the sessions active in the last ``ACTIVE_S`` seconds, the one with the
longest last prompt that is still shorter than its own drawn length (if none is, it starts a
session): the published trace's follow-ups reuse most of their prompt.
"""

from __future__ import annotations

import math
import random

from loadtest.workloads.base import History, Ids, Row, poisson
from loadtest.workloads.core import TRACE_BLOCK_TOKENS

RATE = 3.40
INPUT_MEDIAN = 6_909
INPUT_MEAN = 12_035
INPUT_MAX = 126_195
OUTPUT_MEAN = 343
OUTPUT_SIGMA = 216
FOLLOW_UP = 0.387
ACTIVE_S = 600.0


def mooncake_synth(rng: random.Random, horizon_s: float) -> list[Row]:
    ids = Ids()
    first = ids.shared("block0", TRACE_BLOCK_TOKENS)
    sigma = math.sqrt(2 * math.log(INPUT_MEAN / INPUT_MEDIAN))
    sessions: list[tuple[float, History]] = []  # (last request time, history after block 0)
    rows: list[Row] = []
    for t in poisson(rng, RATE, horizon_s):
        length = min(INPUT_MAX, max(TRACE_BLOCK_TOKENS + 1, round(rng.lognormvariate(math.log(INPUT_MEDIAN), sigma))))
        output = max(1, round(rng.gauss(OUTPUT_MEAN, OUTPUT_SIGMA)))
        stale = 0  # sessions are kept in order of their last request: the stale ones lead
        while stale < len(sessions) and t - sessions[stale][0] > ACTIVE_S:
            stale += 1
        del sessions[:stale]
        history = None
        if rng.random() < FOLLOW_UP:
            room = length - TRACE_BLOCK_TOKENS
            best = max(
                (i for i, (_, h) in enumerate(sessions) if h.tokens < room),
                key=lambda k: sessions[k][1].tokens,
                default=None,
            )
            if best is not None:
                history = sessions.pop(best)[1]
                history.tail = 0  # the previous partial block is re-issued as the session grows
        if history is None:
            history = History(ids)
        history.add(length - TRACE_BLOCK_TOKENS - history.tokens)
        rows.append(history.row(t * 1000, output, first))
        sessions.append((t, history))
    return rows
