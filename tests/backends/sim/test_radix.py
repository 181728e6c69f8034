"""``backends/sim/radix.py``: the radix prefix cache over token blocks: matching (key, size and parent),
locks, LRU eviction of unlocked leaves (or vLLM's least-recently-freed order), the host tier (HiCache),
its observer's events, and the incremental token accounting ``check()`` recomputes."""

from __future__ import annotations

import pytest

from backends.sim.radix import Node, RadixCache


def chain(c: RadixCache, keys: list[int], ntok: int = 10, parent: Node | None = None) -> list[Node]:
    node = parent or c.root
    out = []
    for k in keys:
        node, _ = c.put(node, k, ntok)
        out.append(node)
    return out


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def stored(self, key: int, parent: int, ntok: int) -> None:
        self.events.append(("stored", str(key), str(parent), str(ntok)))

    def removed(self, key: int, ntok: int) -> None:
        self.events.append(("removed", str(key), str(ntok)))

    def cleared(self) -> None:
        self.events.append(("cleared",))


def test_radix_lru_evicts_oldest_unlocked_leaf_first() -> None:
    c = RadixCache()
    leaves = {}
    for name in ("a", "b", "c"):
        node = c.root
        for i in range(3):
            node, _ = c.put(node, hash((name, i)), 10)
        leaves[name] = node
    for name in ("a", "b", "c"):
        c.lock(leaves[name])
    for name in ("b", "a", "c"):  # release order sets recency: b oldest, then a, then c
        c.touch_path(leaves[name])
        c.unlock(leaves[name])
    assert c.evictable_tokens == 90
    assert c.evict(10) == 10
    assert hash(("b", 2)) not in c.nodes and hash(("a", 2)) in c.nodes
    assert c.evict(20) == 20  # b's remaining path goes before a is touched
    assert all(hash(("b", i)) not in c.nodes for i in range(3))
    assert c.evict(10) == 10 and hash(("a", 2)) not in c.nodes and hash(("c", 2)) in c.nodes
    c.check()


def test_locked_path_is_never_evicted() -> None:
    c = RadixCache()
    node = c.root
    for i in range(4):
        node, _ = c.put(node, 100 + i, 25)
    c.lock(node)
    other = c.root
    for i in range(2):
        other, _ = c.put(other, 200 + i, 25)
    assert c.evict(10**6) == 50  # only the unlocked branch can go
    assert all(100 + i in c.nodes for i in range(4))
    c.unlock(node)
    assert c.evict(10**6) == 100
    c.check()


def test_radix_match_checks_size_and_parent_not_just_the_key() -> None:
    c = RadixCache()
    a, _ = c.put(c.root, 1, 10)
    c.put(a, 2, 10)
    assert c.match([(1, 10), (2, 10)]) == (2, 0)
    assert c.match([(1, 10), (2, 7)]) == (1, 0)  # same key, other size
    assert c.match([(2, 10)]) == (0, 0)  # same key and size, other parent
    assert c.conflicts(c.root, 2, 10) and c.conflicts(a, 2, 7) and not c.conflicts(a, 2, 10)
    assert not c.conflicts(c.root, 3, 10)


def test_put_is_idempotent_and_the_accounting_follows_locks() -> None:
    c = RadixCache()
    epoch = c.epoch
    node, new = c.put(c.root, 1, 10)
    assert new and (c.gpu_tokens, c.evictable_tokens) == (10, 10) and c.epoch > epoch
    again, new = c.put(c.root, 1, 10)
    assert again is node and not new and c.gpu_tokens == 10  # a duplicate: the caller's copy is freed
    child, _ = c.put(node, 2, 5)
    c.lock(child)
    assert (c.gpu_tokens, c.evictable_tokens) == (15, 0) and child.lock_ref == node.lock_ref == 1
    before = c.epoch
    c.touch_path(child)
    assert c.epoch == before  # a touch changes no match and nothing evictable
    c.unlock(child)
    assert c.evictable_tokens == 15 and c.epoch > before
    assert c.evict(1) == 5  # whole blocks only: the leaf goes, not a token of it
    assert c.evict(100) == 10 and c.evict(100) == 0 and c.nodes == {}
    c.check()


def test_evicted_blocks_move_to_the_host_tier_and_match_there() -> None:
    c = RadixCache(host_capacity=100)
    _, b, d = chain(c, [1, 2, 3])
    assert c.evict(20) == 20  # the two deepest blocks leave the GPU, the top one stays
    assert (c.gpu_tokens, c.host_tokens, c.evicted_tokens) == (10, 20, 20)
    assert c.match([(1, 10), (2, 10), (3, 10), (4, 10)]) == (1, 2)  # one on the GPU, then two in the host tier
    c.load_back(b)
    assert b.on_gpu and c.match([(1, 10), (2, 10), (3, 10)]) == (2, 1)
    node, new = c.put(b, 3, 10)  # recomputing a host block brings it back: the caller's KV backs it
    assert node is d and new and c.host_tokens == 0 and c.gpu_tokens == 30
    c.check()


def test_a_full_host_tier_drops_its_least_recent_leaves_and_a_block_too_big_is_dropped() -> None:
    c = RadixCache(host_capacity=25)
    chain(c, [1, 2])  # path A
    chain(c, [3, 4])  # path B
    c.touch_path(c.nodes[4])  # B more recent
    assert c.evict(20) == 20  # A leaves the GPU: its two blocks fill 20 of the 25 host tokens
    assert c.host_tokens == 20 and 1 in c.nodes and 2 in c.nodes
    assert c.evict(10) == 10  # B's leaf needs room: A's leaf (least recent) is dropped for it
    assert 2 not in c.nodes and 4 in c.nodes and c.host_dropped_tokens == 10
    c.check()
    big = RadixCache(host_capacity=5)
    chain(big, [7])
    assert big.evict(10) == 10 and big.nodes == {} and big.host_tokens == 0
    big.check()


def test_a_gpu_block_dropped_for_lack_of_host_room_takes_its_host_descendants_with_it() -> None:
    c = RadixCache(host_capacity=10)
    (top,) = chain(c, [1], ntok=20)  # bigger than the whole host tier
    chain(c, [2], parent=top)
    assert c.evict(10) == 10 and c.host_tokens == 10  # block 2 to the host tier
    assert c.evict(20) == 20  # block 1 cannot go there: dropped, and block 2 below it with it
    assert c.nodes == {} and c.host_tokens == 0 and c.host_dropped_tokens == 10
    assert c.match([(1, 20), (2, 10)]) == (0, 0)
    c.check()


def test_the_observer_hears_what_sglang_records() -> None:
    c = RadixCache(host_capacity=100)
    rec = Recorder()
    c.observer = rec
    _, b = chain(c, [1, 2])
    c.evict(10)
    c.load_back(b)
    c.evict(100)
    c.reset()
    assert rec.events == [
        ("stored", "1", "0", "10"),
        ("stored", "2", "1", "10"),
        ("removed", "2", "10"),
        ("stored", "2", "1", "10"),  # loaded back: resident on the GPU again
        ("removed", "2", "10"),
        ("removed", "1", "10"),
        ("cleared",),
    ]
    assert c.observer is rec  # a reset keeps its observer


def test_reset_refuses_a_cache_with_locked_blocks_and_check_finds_a_drifted_counter() -> None:
    c = RadixCache()
    (node,) = chain(c, [1])
    c.lock(node)
    with pytest.raises(AssertionError, match="locked"):
        c.reset()
    c.unlock(node)
    c.evictable_tokens += 1
    with pytest.raises(AssertionError):
        c.check()


def _free_order_victim(c: RadixCache) -> int:
    """A accessed first but freed last, B accessed later but freed first: which goes first."""
    (a,) = chain(c, [1])
    (b,) = chain(c, [2])
    c.lock(a)
    c.lock(b)
    c.touch_path(a)
    c.touch_path(b)
    c.unlock(b)
    c.unlock(a)
    c.evict(10)
    return 2 if 2 not in c.nodes else 1


def test_sglangs_order_evicts_the_least_recently_accessed_vllms_the_least_recently_freed() -> None:
    assert _free_order_victim(RadixCache()) == 1
    assert _free_order_victim(RadixCache(stamp_on_free=True)) == 2


def test_a_reset_keeps_the_eviction_order() -> None:
    c = RadixCache(stamp_on_free=True)
    c.reset()
    assert _free_order_victim(c) == 2
