"""Shared documents with Zipf popularity: a few huge hot prefixes and a long tail of cold ones.

``DOCS`` documents (a code base, a manual, a long PDF); document of popularity rank ``r`` (1 = hottest)
is asked about with probability ∝ ``r^-s``. The hottest ``HUGE`` documents are 48-64k tokens, the
others log-normal (median 6k, sigma 0.9, 1-40k). Each request is one document plus a fresh
question (log-normal, median 200 tokens) and a short answer (median 150): single-turn RAG / "chat
with a document" traffic. Published statistic it reproduces: Alibaba's production KV-cache study
(Wang et al., ATC'25, "KVCache Cache in the Wild") finds reuse heavily skewed, 10% of blocks giving
77% of the reuse; with ``s`` = 0.8-1.2 over 300 documents the top 10% of documents carry 60-85% of
the requests. Members: ``zipf-docs`` (s = 0.8, tuning) and ``zipf-hot`` (s = 1.2, held out).
"""

from __future__ import annotations

import itertools
import random

from loadtest.workloads.base import History, Ids, Row, lognormal, poisson

DOCS = 300
HUGE = 3
HUGE_TOKENS = (48_000, 64_000)
DOC_MEDIAN = 6_000
RATE = 4.0
"""Requests per second at speedup 1 (the comparison's 8-backend rate)."""


def zipf_rows(rng: random.Random, horizon_s: float, s: float) -> list[Row]:
    ids = Ids()
    sizes = [
        rng.randrange(*HUGE_TOKENS) if r < HUGE else lognormal(rng, DOC_MEDIAN, 0.9, 1_000, 40_000) for r in range(DOCS)
    ]
    docs = [ids.shared(f"doc{r}", sizes[r]) for r in range(DOCS)]
    cum = list(itertools.accumulate((r + 1) ** -s for r in range(DOCS)))
    rows: list[Row] = []
    for t in poisson(rng, RATE, horizon_s):
        doc = rng.choices(range(DOCS), cum_weights=cum)[0]
        question = History(ids)
        question.add(lognormal(rng, 200, 1.0, 10, 8_000))
        rows.append(question.row(t * 1000, lognormal(rng, 150, 0.8, 5, 2_000), docs[doc]))
    return rows


def zipf_docs(rng: random.Random, horizon_s: float) -> list[Row]:
    """``zipf-docs``: s = 0.8 (tuning)."""
    return zipf_rows(rng, horizon_s, 0.8)


def zipf_hot(rng: random.Random, horizon_s: float) -> list[Row]:
    """``zipf-hot``: s = 1.2 (held out): the hottest document alone draws ~30% of the requests."""
    return zipf_rows(rng, horizon_s, 1.2)
