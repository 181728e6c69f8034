"""Prompt blocks held by the seats of one slot, each counted once.

A shared prefix (an assistant's system prompt and tools, a tenant's instructions) sits once in a
backend's radix cache however many conversations extend it, so the seats of a slot reserve it once:
``reserved = Σ seat tokens − Σ_b (refs_b − 1)⁺ · tokens_b`` over the fingerprint blocks ``b`` the slot's
seats hold. Fingerprints are chained (a block's hash covers every block before it), so the blocks of one
prompt held on a slot are always a prefix of it (``held_prefix`` is a binary search).
"""

from __future__ import annotations

from policies.prefix import held_blocks
from policies.types import Fingerprint


class SlotBlocks:
    """Reference counts of the fingerprint blocks held by a slot's seats."""

    __slots__ = ("refs",)

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}

    def add(self, fp: Fingerprint) -> int:
        """Count ``fp``'s blocks as held once more; the tokens that were already held (no new KV)."""
        refs = self.refs
        shared = 0
        for block, tokens in fp:
            n = refs.get(block, 0)
            if n:
                shared += tokens
            refs[block] = n + 1
        return shared

    def remove(self, fp: Fingerprint) -> int:
        """Count ``fp``'s blocks as held once less; the tokens that stay held by other seats."""
        refs = self.refs
        kept = 0
        for block, tokens in fp:
            n = refs.get(block, 0) - 1
            if n > 0:
                refs[block] = n
                kept += tokens
            elif n == 0:
                del refs[block]
        return kept

    def held_prefix(self, fp: Fingerprint) -> int:
        """Tokens of the longest prefix of ``fp`` already held on this slot."""
        refs = self.refs
        if not refs or not fp or fp[0][0] not in refs:
            return 0
        return sum(tokens for _, tokens in fp[: held_blocks(fp, refs)])

    def shared_of(self, fp: Fingerprint) -> int:
        """Tokens of ``fp``'s blocks that another seat holds too (what releasing ``fp`` would not free)."""
        refs = self.refs
        return sum(tokens for block, tokens in fp if refs.get(block, 0) > 1)
