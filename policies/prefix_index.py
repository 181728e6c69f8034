"""What each backend (or DP rank) probably holds in its prefix cache, learned from what was sent.

The gateway cannot see an engine's radix tree, so it keeps its own approximation per cache (a
backend, or one rank of a data-parallel backend: each rank has its own KV pool and tree): the
blocks of every prompt dispatched there (the engine caches a prompt as it prefills it), refreshed
when the request completes, bounded in tokens by the engine's ``max_total_num_tokens`` and evicted
least-recently-used first, like the engine. Output tokens are unknown live, so the next turn's new
blocks simply miss.

Leaves go first, as in the engine: a prompt's blocks are touched deepest-first, so every block is
at least as recent as its descendants and eviction never removes a block whose continuation stays.
The held blocks of any chain are therefore always a prefix of it, which makes a match a binary
search: ``O(log n)`` lookups for an ``n``-block fingerprint.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from itertools import accumulate
from operator import itemgetter

from policies.prefix import held_blocks
from policies.types import Fingerprint

DEFAULT_CAPACITY_TOKENS = 1_000_000
"""Used until a backend reports its ``max_total_num_tokens`` (``BackendView.kv_tokens`` = 0)."""


class BlockLRU:
    """One cache: an LRU over blocks, bounded by the sum of their tokens.

    Parameters: ``capacity_tokens`` (the engine's ``max_total_num_tokens`` for this rank).
    """

    __slots__ = ("_blocks", "_last", "capacity", "tokens")

    def __init__(self, capacity_tokens: int = DEFAULT_CAPACITY_TOKENS) -> None:
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self.capacity = max(1, capacity_tokens)
        self.tokens = 0
        self._last: tuple[Fingerprint | None, int] = (None, 0)
        """The last ``matched_blocks`` answer and its fingerprint (admission, ``route`` and ``dispatched``
        ask for the same request's one after another). A match depends only on which blocks are held,
        so it holds until a block is added or evicted; identity: the same tuple, so the same blocks."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def insert(self, fp: Fingerprint) -> None:
        """Hold every block of ``fp`` (most recent: its first block), then evict to capacity."""
        blocks = self._blocks
        move = blocks.move_to_end
        added = 0
        for key, n in reversed(fp):
            if key in blocks:
                move(key)
            else:
                blocks[key] = n
                added += n
        if added:  # else the same blocks are held, only their order changed
            self._last = (None, 0)
            self.tokens += added
            if self.tokens > self.capacity:
                self._evict()

    def resize(self, capacity_tokens: int) -> None:
        self.capacity = max(1, capacity_tokens)
        self._evict()

    def _evict(self) -> None:
        blocks = self._blocks
        while self.tokens > self.capacity and blocks:
            _, n = blocks.popitem(last=False)
            self.tokens -= n
            self._last = (None, 0)

    def matched_blocks(self, fp: Fingerprint) -> int:
        """How many leading blocks of ``fp`` are held (binary search; held blocks form a prefix)."""
        last, matched = self._last
        if fp is last:
            return matched
        matched = held_blocks(fp, self._blocks)
        self._last = (fp, matched)
        return matched


def cumulative_tokens(fp: Fingerprint) -> list[int]:
    """``c[i]`` = tokens in the first ``i`` blocks of ``fp`` (``c[0]`` = 0)."""
    return [0, *accumulate(map(_TOKENS, fp))]


_TOKENS = itemgetter(1)
"""A fingerprint block's token count."""


class PrefixIndex:
    """A ``BlockLRU`` per cache slot (any hashable id; the routers use ``(backend, rank)``).

    Parameters: ``default_capacity`` tokens for a slot whose capacity was never set (1,000,000).
    """

    def __init__(self, default_capacity: int = DEFAULT_CAPACITY_TOKENS) -> None:
        self.default_capacity = default_capacity
        self._slots: dict[Hashable, BlockLRU] = {}

    def slot(self, slot: Hashable) -> BlockLRU:
        lru = self._slots.get(slot)
        if lru is None:
            lru = self._slots[slot] = BlockLRU(self.default_capacity)
        return lru

    def set_capacity(self, slot: Hashable, capacity_tokens: int) -> None:
        """Bound ``slot`` to ``capacity_tokens`` (0 or less: keep the current bound)."""
        if capacity_tokens > 0:
            lru = self.slot(slot)
            if lru.capacity != capacity_tokens:
                lru.resize(capacity_tokens)

    def insert(self, slot: Hashable, fp: Fingerprint) -> None:
        if fp:
            lru = self._slots.get(slot)
            (lru if lru is not None else self.slot(slot)).insert(fp)

    def matched_tokens(self, slot: Hashable, fp: Fingerprint, cum: Sequence[int] | None = None) -> int:
        """Tokens of ``fp``'s prefix that ``slot`` probably holds (``cum``: ``cumulative_tokens(fp)``)."""
        lru = self._slots.get(slot)
        if lru is None or not fp:
            return 0
        blocks = lru.matched_blocks(fp)
        if cum is not None:
            return cum[blocks]
        return sum(map(_TOKENS, fp[:blocks]))

    def match_all(self, fp: Fingerprint, slots: Iterable[Hashable]) -> dict[Hashable, int]:
        """``matched_tokens`` for several slots, sharing one cumulative sum."""
        cum = cumulative_tokens(fp)
        return {s: self.matched_tokens(s, fp, cum) for s in slots}

    def held_tokens(self, slot: Hashable) -> int:
        lru = self._slots.get(slot)
        return 0 if lru is None else lru.tokens

    def drop(self, slot: Hashable) -> None:
        """Forget ``slot`` (a backend removed from the pool, or restarted with an empty cache)."""
        self._slots.pop(slot, None)
