"""Chat-shaped members of the family: many short sessions behind one large system prompt, the same
sessions arriving in bursts, and conversations that move between two assistants.

Session shape (LMSYS-Chat-1M, Zheng et al. 2023, Table 1: 2.0 turns per conversation, 69.5 prompt
tokens and 214.5 response tokens on average): turns ``1 + Geometric`` with mean ``TURNS_MEAN``,
user messages log-normal with median ``USER_MEDIAN``, answers log-normal with median
``ANSWER_MEDIAN`` (both ``sigma`` 0.8, so the means land near the published ones), and a user who
reads and types ``U(THINK_S)`` seconds between an answer and the next message (open loop: the next
turn is sent at the previous turn's send time + ``RESPONSE_S`` + think).
"""

from __future__ import annotations

import random

from loadtest.workloads.base import History, Ids, Row, lognormal, on_off, poisson

TURNS_MEAN = 2.0
USER_MEDIAN = 50
ANSWER_MEDIAN = 150
SIGMA = 0.8
THINK_S = (5.0, 40.0)
RESPONSE_S = 8.0
"""A typical answer's time on screen before the user starts reading (open loop: not measured)."""


def _turns(rng: random.Random, mean: float) -> int:
    p = 1.0 / mean  # 1 + Geometric(p) - 1 ... mean turns = 1/p
    n = 1
    while rng.random() > p:
        n += 1
    return n


def _session(
    rng: random.Random, ids: Ids, start_s: float, prefixes: list[list[int]], switch: float, first_user: int
) -> list[Row]:
    """One session's rows: ``prefixes[k]`` before the history (``switch``: chance a turn moves to the
    session's other prefix, each turn)."""
    rows: list[Row] = []
    history = History(ids)
    t = start_s
    current = 0
    for turn in range(_turns(rng, TURNS_MEAN)):
        if turn:
            t += RESPONSE_S + rng.uniform(*THINK_S)
            if len(prefixes) > 1 and rng.random() < switch:
                current = 1 - current
        history.add(first_user if turn == 0 else lognormal(rng, USER_MEDIAN, SIGMA, 5, 4_000))
        answer = lognormal(rng, ANSWER_MEDIAN, SIGMA, 10, 2_000)
        rows.append(history.row(t * 1000, answer, prefixes[current]))
        history.add(answer)
    return rows


SYSTEM_TOKENS = 8_192
CHAT_RATE = 1.5
"""New sessions per second (at speedup 1, the rate the comparison uses for 8 backends)."""


def chat_shared_prompt(rng: random.Random, horizon_s: float) -> list[Row]:
    """``chat-shared-prompt``: every session behind one 8k-token system prompt (an enterprise assistant,
    a RAG template): the prefix is hot everywhere, so load is what routing should follow."""
    ids = Ids()
    system = ids.shared("system", SYSTEM_TOKENS)
    rows: list[Row] = []
    for t in poisson(rng, CHAT_RATE, horizon_s):
        rows += _session(rng, ids, t, [system], 0.0, lognormal(rng, USER_MEDIAN, SIGMA, 5, 4_000))
    return rows


BURST_RATE = 8.0
BURST_ON_S = (10.0, 40.0)
BURST_OFF_S = (30.0, 120.0)
BURST_SYSTEMS = 4
BURST_DOC_MEDIAN = 3_000


def bursty_chat(rng: random.Random, horizon_s: float) -> list[Row]:
    """``bursty-chat``: sessions arrive in on/off bursts (BurstGPT, Wang et al. 2024: conversation-service
    inter-arrivals are burstier than Poisson, Gamma-shaped with a coefficient of variation above 1;
    here on 10-40 s at 8 sessions/s, off 30-120 s: about 2 sessions/s on average). Each
    session opens on one of four 4k-token assistant prompts with a pasted document (log-normal,
    median 3k tokens) then chats: a burst lands many cold, mid-sized prompts at once."""
    ids = Ids()
    systems = [ids.shared(f"system{k}", 4_096) for k in range(BURST_SYSTEMS)]
    rows: list[Row] = []
    for t in on_off(rng, BURST_RATE, BURST_ON_S, BURST_OFF_S, horizon_s):
        first = lognormal(rng, BURST_DOC_MEDIAN, 1.0, 200, 60_000)
        rows += _session(rng, ids, t, [rng.choice(systems)], 0.0, first)
    return rows


PAIRS = 3
ASSISTANT_TOKENS = (6_144, 12_288)
SWITCH = 0.35
HANDOFF_RATE = 0.5
HANDOFF_TURNS_MEAN = 6.0
HANDOFF_START_MEDIAN = 4_000


def two_assistants(rng: random.Random, horizon_s: float) -> list[Row]:
    """``two-assistants`` (held out): each conversation moves between the two assistants of its pair
    (a triage agent and a specialist, a chat and a code assistant: six system prompts of 6-12k tokens
    in three pairs), switching with probability 0.35 per turn; mean 6 turns, opening context
    log-normal (median 4k). The history after the other assistant's prompt is another cache chain,
    so a conversation has two warm places, each the other's cold one."""
    ids = Ids()
    prompts = [
        [ids.shared(f"assistant{p}.{k}", rng.randrange(*ASSISTANT_TOKENS, 512)) for k in range(2)] for p in range(PAIRS)
    ]
    rows: list[Row] = []
    for t in poisson(rng, HANDOFF_RATE, horizon_s):
        pair = rng.choice(prompts)
        first = lognormal(rng, HANDOFF_START_MEDIAN, 1.0, 200, 60_000)
        rows += _session_long(rng, ids, t, pair, first)
    return rows


def _session_long(rng: random.Random, ids: Ids, start_s: float, pair: list[list[int]], first: int) -> list[Row]:
    rows: list[Row] = []
    history = History(ids)
    t = start_s
    current = rng.randrange(2)
    for turn in range(_turns(rng, HANDOFF_TURNS_MEAN)):
        if turn:
            t += RESPONSE_S + rng.uniform(*THINK_S)
            if rng.random() < SWITCH:
                current = 1 - current
        history.add(first if turn == 0 else lognormal(rng, 400, 1.0, 5, 20_000))
        answer = lognormal(rng, 300, SIGMA, 10, 3_000)
        rows.append(history.row(t * 1000, answer, pair[current]))
        history.add(answer)
    return rows
