"""``agents-and-completions``: long-context coding agents and short completions on one fleet.

Agents: the ``coding-agent`` conversation (``loadtest/workloads/core.py``: one of three 15k-token assistant
prefixes, a 20-60k opening prompt, tool results log-normal with a mean falling from 6k to 2.5k tokens
as the context grows, answers 200-1,500 tokens, ending near 200-250k tokens; reference §10-11:
a median prompt near 155k) replayed open loop: a turn is sent ``AGENT_GAP_S`` after the previous
one (an answer's time plus the 2-8 s tool run). Agents start as a Poisson process sized to keep
about ``AGENTS`` running. Completions: inline code completion (Splitwise, Patel et al. ISCA'24,
on Azure's coding service: prompts of about 1.5k tokens at the median, outputs of tens of tokens):
one of ``FILES`` open files (Zipf s = 1, 1-6k tokens of context) plus the edit (log-normal, median
150 tokens), 10-100 tokens out, ``COMPLETION_RATE`` a second. The two compete for the same
backends: a completion waits behind an agent's 100k-token recompute, an agent's cache is what the
completions' working sets evict.
"""

from __future__ import annotations

import itertools
import random

from loadtest.workloads.base import History, Ids, Row, log_uniform, lognormal, poisson
from loadtest.workloads.core import CodingAgent

AGENTS = 24
"""Agents running at once at speedup 1 (the comparison's 8-backend rate: 3 per backend)."""
AGENT_GAP_S = (8.0, 20.0)
AGENT_TURNS_MEAN = 45
FILES = 400
COMPLETION_RATE = 2.0


def agents_and_completions(rng: random.Random, horizon_s: float) -> list[Row]:
    ids = Ids()
    agent = CodingAgent(seed=rng.randrange(1 << 30))
    prefixes = [ids.shared(f"agent{k}", 15_360) for k in range(3)]
    rows: list[Row] = []
    duration = AGENT_TURNS_MEAN * sum(AGENT_GAP_S) / 2
    # The agents already running at 0 (started in the past), then new ones at the rate that keeps AGENTS.
    starts = [-rng.uniform(0, duration) for _ in range(AGENTS)]
    starts += list(poisson(rng, AGENTS / duration, horizon_s))
    for n, start in enumerate(starts):
        conv = agent.conversation(n, 0)
        history = History(ids)
        key = conv.turns[0].new[0].pieces[0][0]  # "agent{k}/system+tools"
        prefix = prefixes[int(key.split("/")[0].removeprefix("agent"))]
        t = start
        for i, turn in enumerate(conv.turns):
            if i:
                t += rng.uniform(*AGENT_GAP_S)
            new = turn.new[1:] if i == 0 else turn.new  # the first turn's prefix is ``prefix``
            history.add(sum(seg.tokens for seg in new))
            if t >= 0:
                rows.append(history.row(t * 1000, turn.output_tokens, prefix))
            history.add(turn.output_tokens)
    files = [ids.shared(f"file{f}", lognormal(rng, 2_000, 0.6, 1_000, 6_000)) for f in range(FILES)]
    cum = list(itertools.accumulate(1.0 / (f + 1) for f in range(FILES)))
    for t in poisson(rng, COMPLETION_RATE, horizon_s):
        edit = History(ids)
        edit.add(lognormal(rng, 150, 1.0, 5, 3_000))
        f = rng.choices(range(FILES), cum_weights=cum)[0]
        rows.append(edit.row(t * 1000, log_uniform(rng, 10, 100), files[f]))
    return rows
