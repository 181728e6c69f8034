"""``backends/sim/engine_types.py``: the engine's records, and the block a finished request inserts for
its output when the caller gives none (so that the next turn, built as prompt + that block + new
blocks, matches the whole history)."""

from __future__ import annotations

from backends.sim.engine_types import EngineRequest, default_output_block
from backends.sim.tokenizer import chain_key, text_blocks


def test_the_output_block_chains_on_the_last_prompt_block_and_holds_the_output_tokens() -> None:
    prompt = text_blocks("x" * 4000, 256)
    key, ntok = default_output_block(prompt, "r1", 99)
    assert ntok == 99
    assert key == chain_key(prompt[-1][0], b"output:r1")
    assert default_output_block(prompt, "r1", 99) == (key, ntok)  # deterministic
    assert default_output_block(prompt, "r2", 99)[0] != key  # each request's output is its own
    other = text_blocks("y" * 4000, 256)
    assert default_output_block(other, "r1", 99)[0] != key  # and hangs under its own prompt
    assert default_output_block([], "r1", 5) == (chain_key(0, b"output:r1"), 5)


def test_a_requests_prompt_length_is_the_sum_of_its_blocks() -> None:
    req = EngineRequest("r", [(1, 256), (2, 256), (3, 17)], output_tokens=4, max_new_tokens=8)
    assert req.prompt_tokens == 529
    assert EngineRequest("e", [], 1, 1).prompt_tokens == 0
    assert (req.final_blocks, req.dp_rank) == (None, None)
