"""``backends/sim/tokenizer.py``: the 4-bytes-per-token stand-in: counts, chained block keys (equal
prefixes give equal leading blocks, and a key names its whole prefix), and seeded filler text."""

from __future__ import annotations

import pytest

from backends.sim.tokenizer import BYTES_PER_TOKEN, chain_key, count_tokens, filler_text, text_blocks


@pytest.mark.parametrize(
    ("text", "tokens"), [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("é" * 4, 2), (b"12345678", 2)]
)
def test_tokens_are_utf8_bytes_over_four_rounded_up(text: str | bytes, tokens: int) -> None:
    assert count_tokens(text) == tokens


def test_a_key_depends_on_its_parent_and_its_bytes() -> None:
    assert chain_key(0, b"abc") == chain_key(0, b"abc")
    assert chain_key(0, b"abc") != chain_key(1, b"abc") != chain_key(1, b"abd")
    assert 0 <= chain_key(2**64 - 1, b"x") < 2**64


def test_blocks_split_the_text_and_chain_their_keys() -> None:
    text = "x" * (10 * BYTES_PER_TOKEN + 3)
    blocks = text_blocks(text, 4)
    assert [n for _, n in blocks] == [4, 4, 3]  # 11 tokens: the last block is short
    first = chain_key(0, text[:16].encode())
    assert blocks[0][0] == first and blocks[1][0] == chain_key(first, text[16:32].encode())
    assert text_blocks("", 4) == [] and text_blocks(text.encode(), 4) == blocks


def test_equal_prefixes_share_leading_blocks_and_nothing_after_the_first_difference() -> None:
    base = filler_text("conv", 100)
    a = text_blocks(base + "A" * 40, 16)
    b = text_blocks(base + "B" * 40, 16)
    assert a[:6] == b[:6]  # 96 common tokens: six whole blocks
    assert all(x != y for x, y in zip(a[6:], b[6:], strict=True))  # once they differ, every later key differs
    same_bytes_elsewhere = text_blocks("y" * 64 + base[64:], 16)
    assert same_bytes_elsewhere[1][0] != text_blocks(base, 16)[1][0]  # a key names its whole prefix, not its bytes


def test_filler_text_has_exactly_the_tokens_asked_and_is_seeded() -> None:
    text = filler_text(7, 123)
    assert len(text.encode()) == 123 * BYTES_PER_TOKEN and count_tokens(text) == 123 and text.isascii()
    assert filler_text(7, 123) == text and filler_text("7", 123) != filler_text(8, 123)
    assert filler_text(7, 0) == ""
