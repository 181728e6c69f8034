"""A deterministic stand-in for a real tokenizer.

One token is ``BYTES_PER_TOKEN`` (4) bytes of UTF-8, counted from the start of the text, so two
texts with an equal prefix have equal leading tokens and therefore equal leading blocks. The
simulated SGLang server and the load generator both use these functions, which is what makes a
resent conversation hit the twin's prefix cache exactly as it would hit a real engine's.
"""

from __future__ import annotations

import hashlib
import random

BYTES_PER_TOKEN = 4

Block = tuple[int, int]
"""A run of tokens in the prefix cache: (chained key, number of tokens)."""


def count_tokens(text: str | bytes) -> int:
    """Tokens in ``text``: ceil(utf-8 bytes / 4)."""
    data = text.encode() if isinstance(text, str) else text
    return -(-len(data) // BYTES_PER_TOKEN)


def chain_key(parent: int, payload: bytes) -> int:
    """64-bit key of a block given its parent's key: equal keys mean equal prefixes."""
    h = hashlib.blake2b(payload, digest_size=8, key=parent.to_bytes(8, "little"))
    return int.from_bytes(h.digest(), "little")


def text_blocks(text: str | bytes, block_tokens: int) -> list[Block]:
    """Split ``text`` into blocks of ``block_tokens`` tokens with chained keys.

    The last block may be shorter; its key covers only its own bytes, so it matches another text
    only where that text has the very same bytes there and then ends or goes on identically.
    """
    data = text.encode() if isinstance(text, str) else text
    step = block_tokens * BYTES_PER_TOKEN
    blocks: list[Block] = []
    parent = 0
    for start in range(0, len(data), step):
        chunk = data[start : start + step]
        parent = chain_key(parent, chunk)
        blocks.append((parent, -(-len(chunk) // BYTES_PER_TOKEN)))
    return blocks


_ALPHABET = "abcdefghijklmnopqrstuvwxyz      \n(){}[]=+-_.,:;"


def filler_text(seed: int | str, tokens: int) -> str:
    """Deterministic ASCII text of exactly ``tokens`` tokens (4 bytes each) for a given seed."""
    rng = random.Random(seed)
    return "".join(rng.choices(_ALPHABET, k=tokens * BYTES_PER_TOKEN))
