"""``warm_start``: each slot's first conversation is entered at a random turn with its history."""

from __future__ import annotations

from itertools import islice

from loadtest.workloads.core import CodingAgent


def test_first_conversation_enters_midway_with_its_history() -> None:
    cold, warm = CodingAgent(seed=3), CodingAgent(seed=3, warm_start=True)
    entered = 0
    for slot in range(12):
        c0, c1 = islice(cold.conversations(slot), 2)
        w0, w1 = islice(warm.conversations(slot), 2)
        assert w1.turns == c1.turns  # only the first conversation of a slot is entered midway
        k = len(c0.turns) - len(w0.turns)
        assert 0 <= k < len(c0.turns)
        assert w0.turns[1:] == c0.turns[k + 1 :]
        first = w0.turns[0]
        assert first.output_tokens == c0.turns[k].output_tokens
        if k:
            entered += 1
            history = sum(s.tokens for t in c0.turns[: k + 1] for s in t.new) + sum(
                t.output_tokens for t in c0.turns[:k]
            )
            assert sum(s.tokens for s in first.new) == history  # every earlier message and answer
            assert [s.role for s in first.new][:3] == ["system", "user", "assistant"]
    assert entered >= 9  # most slots start at a later turn
