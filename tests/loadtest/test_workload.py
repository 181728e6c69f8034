"""Workloads: determinism, the coding-agent targets, trace replay, teams."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from backends.sim.tokenizer import text_blocks
from loadtest.workloads.core import (
    PREFIX_TOKENS,
    CodingAgent,
    PromptChain,
    TeamSpec,
    TraceWorkload,
    parse_teams,
    segment_blocks,
)
from loadtest.workloads.spec import make_workload
from tests.harness import ROOT

# The public trace ships beside the repository (shared/traces/), not in it.
TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def _prompts(w: CodingAgent, slots: int) -> tuple[list[int], float]:
    """Prompt sizes of every turn, and the share of prompt tokens seen before (sent or generated)."""
    prompts: list[int] = []
    total = new = 0
    for slot in range(slots):
        conv = w.conversation(slot, 0)
        ctx = 0
        for i, turn in enumerate(conv.turns):
            if i:
                ctx += conv.turns[i - 1].output_tokens  # the previous answer, generated before
            added = sum(s.tokens for s in turn.new)
            fresh = added - (PREFIX_TOKENS if i == 0 else 0)  # the shared prefix was seen before
            ctx += added
            prompts.append(ctx)
            total += ctx
            new += fresh
    return prompts, 1 - new / total


def test_same_seed_same_requests() -> None:
    a, b, c = CodingAgent(seed=7), CodingAgent(seed=7), CodingAgent(seed=8)
    assert a.conversation(3, 2) == b.conversation(3, 2)
    assert a.conversation(3, 2) != c.conversation(3, 2)
    ta = list(TraceWorkload(TRACE, seed=3).requests(parse_teams("x:1,y:3"), until_s=60))
    tb = list(TraceWorkload(TRACE, seed=3).requests(parse_teams("x:1,y:3"), until_s=60))
    assert ta == tb and len(ta) > 100


def test_coding_agent_matches_documented_targets() -> None:
    prompts, seen = _prompts(CodingAgent(seed=1), 120)
    median = statistics.median(prompts)
    assert 140_000 <= median <= 170_000, median  # §7: "a median prompt near 155k"
    assert seen > 0.95, seen
    assert min(prompts) >= 20_000 and max(prompts) <= 250_000
    conv = CodingAgent(seed=1).conversation(0, 0)
    answers = [t.output_tokens for t in conv.turns]
    assert min(answers) >= 200 and max(answers) <= 1500
    thinks = [t.think_s for t in conv.turns]
    assert all(2 <= t <= 8 for t in thinks)


def test_tool_results_larger_early_than_late() -> None:
    early: list[int] = []
    late: list[int] = []
    w = CodingAgent(seed=2)
    for slot in range(60):
        conv = w.conversation(slot, 0)
        ctx = conv.turns[0].new[0].tokens + conv.turns[0].new[1].tokens
        for turn in conv.turns[1:]:
            (early if ctx < 80_000 else late if ctx > 170_000 else []).append(turn.new[0].tokens)
            ctx += turn.new[0].tokens
    assert statistics.mean(early) > 1.6 * statistics.mean(late)
    assert max(early) > 4 * statistics.median(early)  # long-tailed


def test_scale_and_think_scale() -> None:
    full = CodingAgent(seed=1).conversation(0, 0)
    small = CodingAgent(seed=1, scale=0.05, think_scale=0.1).conversation(0, 0)
    assert len(small.turns) == len(full.turns)
    assert small.turns[1].new[0].tokens == pytest.approx(full.turns[1].new[0].tokens * 0.05, abs=1)
    assert small.turns[1].think_s == pytest.approx(full.turns[1].think_s * 0.1)


def test_shared_prefix_and_resent_history_share_blocks() -> None:
    w = CodingAgent(seed=1)
    convs = [w.conversation(s, 0) for s in range(12)]
    by_assistant: dict[str, list] = {}
    for c in convs:
        by_assistant.setdefault(c.turns[0].new[0].pieces[0][0], []).append(c)
    assert 2 <= len(by_assistant) <= 3
    group = max(by_assistant.values(), key=len)
    a, b = (segment_blocks(c.turns[0].new[0], 1024) for c in group[:2])
    assert a == b  # same assistant, same system+tools blocks
    # turn 2's prompt starts with turn 1's prompt plus its answer
    c = convs[0]
    chain = PromptChain()
    for seg in c.turns[0].new:
        chain.extend(seg)
    first = list(chain.blocks)
    chain.extend(c.answer_segment(0))
    for seg in c.turns[1].new:
        chain.extend(seg)
    assert chain.blocks[: len(first)] == first
    assert chain.tokens == sum(n for _, n in first) + c.turns[0].output_tokens + c.turns[1].new[0].tokens


def test_trace_equal_hash_ids_equal_blocks_and_text(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1200, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 9]},
        {"timestamp": 4000, "input_length": 300, "output_length": 2, "hash_ids": [5]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    reqs = list(TraceWorkload(path, speedup=2.0).requests())
    assert [r.arrival_s for r in reqs] == [0.0, 0.75, 2.0]
    assert [r.output_tokens for r in reqs] == [5, 7, 2]
    assert [r.prompt.tokens for r in reqs] == [1200, 1100, 300]
    a, b = (segment_blocks(r.prompt, 512) for r in reqs[:2])
    assert a[:2] == b[:2] and a[2] != b[2]
    ta, tb = reqs[0].prompt.text(), reqs[1].prompt.text()
    assert ta[: 1024 * 4] == tb[: 1024 * 4] and ta[1024 * 4 :] != tb[1024 * 4 :]
    # the twin's tokenizer sees the same: equal leading text blocks
    assert text_blocks(ta, 512)[:2] == text_blocks(tb, 512)[:2]


def test_real_trace_keeps_timestamps() -> None:
    w = make_workload(f"trace:{TRACE}", speedup=4.0)
    assert isinstance(w, TraceWorkload)
    reqs = list(w.requests(until_s=30))
    raw = [json.loads(line) for line in TRACE.open().readlines()[: len(reqs) + 1]]
    assert [r.arrival_s for r in reqs] == [row["timestamp"] / 4000 for row in raw[: len(reqs)]]
    assert raw[len(reqs)]["timestamp"] / 4000 > 30
    assert all(r.prompt.pieces[0][0] == "mc/0" for r in reqs[:5])


def test_teams_parsing_and_split() -> None:
    assert parse_teams("big:40,small:8:sk-1") == [TeamSpec("big", 40), TeamSpec("small", 8, "sk-1")]
    assert parse_teams(None, 16) == [TeamSpec("default", 16)]
    for bad in ("big", "big:x", "a:1,a:2"):
        with pytest.raises(ValueError):
            parse_teams(bad)
    reqs = list(TraceWorkload(TRACE).requests(parse_teams("a:1,b:3"), until_s=120))
    share_b = sum(r.team == "b" for r in reqs) / len(reqs)
    assert 0.65 < share_b < 0.85


def test_unknown_workload() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("chatbot")
    with pytest.raises(ValueError, match="not found"):
        make_workload("trace:/nonexistent.jsonl")
