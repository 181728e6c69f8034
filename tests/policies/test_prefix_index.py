"""policies/prefix_index.py: what each cache slot probably holds, an LRU of prompt blocks bounded in
tokens, leaves evicted first, matched by binary search."""

from __future__ import annotations

from policies.prefix_index import DEFAULT_CAPACITY_TOKENS, BlockLRU, PrefixIndex, cumulative_tokens
from policies.types import Fingerprint


def _chain(label: str, sizes: list[int], parent: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[int, int], ...]:
    out = list(parent)
    for i, n in enumerate(sizes):
        out.append((hash((out[-1][0] if out else 0, label, i)) & ((1 << 62) - 1), n))
    return tuple(out)


def test_matched_tokens_is_the_held_prefix() -> None:
    idx = PrefixIndex(default_capacity=10_000)
    base = _chain("sys", [500, 500])
    turn1 = _chain("a", [300, 200], base)
    idx.insert("x", turn1)
    assert idx.matched_tokens("x", turn1) == 1500
    turn2 = _chain("a2", [400], turn1)
    assert idx.matched_tokens("x", turn2) == 1500
    other = _chain("b", [300], base)
    assert idx.matched_tokens("x", other) == 1000
    assert idx.matched_tokens("y", turn1) == 0
    cum = cumulative_tokens(turn2)
    assert idx.matched_tokens("x", turn2, cum) == 1500
    assert idx.match_all(turn2, ["x", "y"]) == {"x": 1500, "y": 0}


def test_lru_evicts_least_recent_within_capacity() -> None:
    idx = PrefixIndex(default_capacity=3000)
    a, b, c = _chain("a", [1000]), _chain("b", [1000]), _chain("c", [1000])
    idx.insert("s", a)
    idx.insert("s", b)
    idx.insert("s", c)
    assert idx.held_tokens("s") == 3000
    idx.insert("s", a)  # touch a: b is now the oldest
    d = _chain("d", [1000])
    idx.insert("s", d)
    assert idx.held_tokens("s") <= 3000
    assert [idx.matched_tokens("s", x) for x in (a, b, c, d)] == [1000, 0, 1000, 1000]


def test_eviction_takes_leaves_first_and_respects_resize() -> None:
    lru = BlockLRU(capacity_tokens=10 * 256)
    long = _chain("conv", [256] * 16)
    lru.insert(long)
    assert lru.tokens <= 10 * 256
    held = lru.matched_blocks(long)
    assert held == 10  # the root side stays, as in the engine's radix cache
    assert all(k in lru for k, _ in long[:held]) and not any(k in lru for k, _ in long[held:])
    idx = PrefixIndex(default_capacity=100_000)
    idx.insert("s", long)
    idx.set_capacity("s", 4 * 256)
    assert idx.held_tokens("s") == 4 * 256
    assert idx.matched_tokens("s", long) == 4 * 256
    idx.set_capacity("s", 0)  # unknown capacity keeps the bound
    assert idx.slot("s").capacity == 4 * 256


def test_shared_prefix_survives_while_conversations_churn() -> None:
    idx = PrefixIndex(default_capacity=20_000)
    system = _chain("sys", [1000] * 4)
    for i in range(50):
        idx.insert("s", _chain(f"c{i}", [1000] * 5, system))
    assert idx.matched_tokens("s", _chain("new", [1000], system)) == 4000
    assert idx.held_tokens("s") <= 20_000


def test_index_handles_long_fingerprints() -> None:
    idx = PrefixIndex(default_capacity=2_000_000)
    long = _chain("big", [256] * 640)  # a 160k-token prompt in 1 KiB blocks
    for slot in range(64):
        idx.insert(slot, long[: 10 * slot + 1])
    matches = idx.match_all(long, range(64))
    assert matches == {s: 256 * (10 * s + 1) for s in range(64)}


def test_cumulative_tokens() -> None:
    assert cumulative_tokens(()) == [0]
    assert cumulative_tokens(((1, 10), (2, 20), (3, 5))) == [0, 10, 30, 35]


def test_an_unknown_slot_holds_nothing_and_an_empty_prompt_matches_nothing() -> None:
    idx = PrefixIndex()
    fp = _chain("a", [100, 100])
    assert idx.matched_tokens("nowhere", fp) == 0 and idx.held_tokens("nowhere") == 0
    idx.insert("s", ())  # an empty fingerprint creates no slot
    assert idx.held_tokens("s") == 0
    idx.insert("s", fp)
    assert idx.matched_tokens("s", ()) == 0
    assert idx.slot("new").capacity == DEFAULT_CAPACITY_TOKENS


def test_insert_counts_each_block_once_and_the_first_block_is_the_most_recent() -> None:
    lru = BlockLRU(capacity_tokens=300)
    a = _chain("a", [100, 100])
    lru.insert(a)
    lru.insert(a)  # the same blocks again: nothing added
    assert lru.tokens == 200 and len(lru) == 2
    lru.insert(_chain("b", [100, 100]))  # 400 > 300: the least recent goes, a's leaf
    assert lru.tokens == 300
    assert a[0][0] in lru and a[1][0] not in lru
    assert lru.matched_blocks(a) == 1


def test_a_cached_match_is_dropped_when_blocks_come_or_go() -> None:
    lru = BlockLRU(capacity_tokens=1000)
    fp = _chain("c", [100, 100, 100])
    lru.insert(fp[:1])
    assert lru.matched_blocks(fp) == 1
    lru.insert(fp[:2])  # a block added: the same fingerprint asks again
    assert lru.matched_blocks(fp) == 2
    lru.resize(100)  # two blocks evicted
    assert lru.matched_blocks(fp) == 1
    equal = tuple(list(fp))  # an equal tuple that is another object is matched afresh
    assert lru.matched_blocks(equal) == 1


def test_capacity_is_at_least_one_token() -> None:
    lru = BlockLRU(capacity_tokens=0)
    assert lru.capacity == 1
    lru.insert(_chain("x", [5]))
    assert lru.tokens == 0 and len(lru) == 0  # a block larger than the whole bound is not kept
    idx = PrefixIndex()
    idx.set_capacity("s", -5)  # unknown (0 or less): no slot bound is set
    assert idx.slot("s").capacity == DEFAULT_CAPACITY_TOKENS


def test_drop_forgets_a_slot() -> None:
    idx = PrefixIndex()
    fp: Fingerprint = _chain("d", [100])
    idx.insert(("b0", 0), fp)
    idx.insert(("b0", 1), fp)
    idx.drop(("b0", 0))
    idx.drop(("b0", 0))  # twice is harmless
    assert idx.match_all(fp, [("b0", 0), ("b0", 1)]) == {("b0", 0): 0, ("b0", 1): 100}
