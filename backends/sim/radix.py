"""Radix prefix cache over token blocks, with lock counts, LRU eviction and an optional host tier.

Blocks carry chained keys (``backends.sim.tokenizer``): a key identifies its whole prefix, so the
tree is indexed by a flat ``key -> Node`` dict and a lookup never walks children. A node is on the
GPU or (HiCache) in the host tier, never both: GPU nodes form a top subtree (a GPU node's parent is
on the GPU), host nodes hang below it. Eviction frees unlocked GPU leaves, least recently accessed
first (a heap with lazy invalidation: an entry is stale once its node's stamp, lock or children
changed); with a host tier the evicted node moves there, and the host tier drops its own LRU
leaves when full. Token accounting (``gpu_tokens``, ``evictable_tokens``, ``host_tokens``) is kept
incrementally, as SGLang keeps ``evictable_size_``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

from backends.sim.tokenizer import Block


class CacheObserver(Protocol):
    """Told when a block becomes resident on the GPU, leaves it, or the whole cache is dropped: what
    SGLang's radix cache records as ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``
    (``mem_cache/events.py``). The twin publishes these (``backends/sim/kv_publisher.py``); the
    simulator feeds its precise cache view with them."""

    def stored(self, key: int, parent: int, ntok: int) -> None: ...
    def removed(self, key: int, ntok: int) -> None: ...
    def cleared(self) -> None: ...


class Node:
    __slots__ = ("children", "gpu_children", "key", "last_access", "lock_ref", "ntok", "on_gpu", "parent")

    def __init__(self, key: int, ntok: int, parent: Node | None) -> None:
        self.key = key
        self.ntok = ntok
        self.parent = parent
        self.children: set[Node] = set()
        self.gpu_children = 0
        self.lock_ref = 0
        self.last_access = 0
        self.on_gpu = True


class RadixCache:
    def __init__(self, host_capacity: int = 0, stamp_on_free: bool = False) -> None:
        """``stamp_on_free``: a block's age is when it was last freed, not accessed (vLLM's eviction
        order: least recently freed first; a request's blocks are freed tail first)."""
        self.stamp_on_free = stamp_on_free
        self.root = Node(0, 0, None)
        self.root.lock_ref = 1  # never evicted
        self.nodes: dict[int, Node] = {}
        self.host_capacity = host_capacity
        self.gpu_tokens = 0
        self.evictable_tokens = 0
        self.host_tokens = 0
        self.evicted_tokens = 0
        self.host_dropped_tokens = 0
        self.epoch = 0
        """Bumped on every change that can alter a match or what is evictable (not on touches)."""
        self._tick = 0
        self._gpu_heap: list[tuple[int, int, Node]] = []
        self._host_heap: list[tuple[int, int, Node]] = []
        self.observer: CacheObserver | None = None

    # ---- lookup ---------------------------------------------------------------------------
    def match(self, blocks: Sequence[Block]) -> tuple[int, int]:
        """(leading blocks on the GPU, following blocks in the host tier).

        A block matches only the node of the same key, size and parent: a key that names another
        prefix (malformed blocks) is a miss, so the matched path holds exactly the caller's tokens.
        The caller counts its prefix from its own blocks and locks this path; were the two to
        differ, admission would reserve for the wrong amount (a request could lock more than it
        counts and never fit).
        """
        nodes = self.nodes
        n = len(blocks)
        parent = self.root
        i = 0
        while i < n:
            key, ntok = blocks[i]
            node = nodes.get(key)
            if node is None or not node.on_gpu or node.ntok != ntok or node.parent is not parent:
                break
            parent = node
            i += 1
        j = i
        while j < n:
            key, ntok = blocks[j]
            node = nodes.get(key)
            if node is None or node.on_gpu or node.ntok != ntok or node.parent is not parent:
                break
            parent = node
            j += 1
        return i, j - i

    def conflicts(self, parent: Node, key: int, ntok: int) -> bool:
        """True if ``key`` is in the tree as another block (other size or parent): ``put`` would
        return that node, not one for (``parent``, ``key``, ``ntok``)."""
        node = self.nodes.get(key)
        return node is not None and (node.ntok != ntok or node.parent is not parent)

    def touch_path(self, node: Node) -> None:
        """Mark ``node`` and its ancestors as just used (SGLang updates the matched path)."""
        self._tick += 1
        t = self._tick
        while node is not self.root and node is not None:
            node.last_access = t
            if node.on_gpu and node.lock_ref == 0 and node.gpu_children == 0:
                heapq.heappush(self._gpu_heap, (t, id(node), node))
            elif not node.on_gpu and not node.children:
                heapq.heappush(self._host_heap, (t, id(node), node))
            node = node.parent  # type: ignore[assignment]

    # ---- locks ----------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                self.evictable_tokens -= node.ntok
                self.epoch += 1
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_tokens += node.ntok
                self.epoch += 1
                if self.stamp_on_free:  # walked tail to root: the tail gets the oldest stamp
                    self._tick += 1
                    node.last_access = self._tick
                if node.gpu_children == 0:
                    heapq.heappush(self._gpu_heap, (node.last_access, id(node), node))
            node = node.parent  # type: ignore[assignment]

    # ---- insertion ------------------------------------------------------------------------
    def put(self, parent: Node, key: int, ntok: int) -> tuple[Node, bool]:
        """Make block ``key`` resident on the GPU under ``parent``.

        Returns (node, new_tokens): ``new_tokens`` is False when the block was already on the GPU
        (the caller's copy is a duplicate and is freed), True when the caller's KV now backs it
        (a new node, or a host-tier node brought back by this very computation).
        """
        node = self.nodes.get(key)
        if node is not None:
            if node.on_gpu:
                return node, False
            self._host_to_gpu(node)
            return node, True
        node = Node(key, ntok, parent)
        node.last_access = self._tick
        parent.children.add(node)
        parent.gpu_children += 1
        self.nodes[key] = node
        self.gpu_tokens += ntok
        self.evictable_tokens += ntok
        self.epoch += 1
        heapq.heappush(self._gpu_heap, (node.last_access, id(node), node))
        if self.observer is not None:
            self.observer.stored(key, parent.key, ntok)
        return node, True

    def load_back(self, node: Node) -> None:
        """Bring a host-tier node back to the GPU (the caller has allocated its tokens)."""
        self._host_to_gpu(node)

    def _host_to_gpu(self, node: Node) -> None:
        node.on_gpu = True
        self.host_tokens -= node.ntok
        self.gpu_tokens += node.ntok
        if node.lock_ref == 0:
            self.evictable_tokens += node.ntok
        parent = node.parent
        assert parent is not None and parent.on_gpu, "a GPU node's parent must be on the GPU"
        parent.gpu_children += 1
        self.epoch += 1
        if node.lock_ref == 0 and node.gpu_children == 0:
            heapq.heappush(self._gpu_heap, (node.last_access, id(node), node))
        if self.observer is not None:
            self.observer.stored(node.key, parent.key, node.ntok)

    # ---- eviction -------------------------------------------------------------------------
    def evict(self, need: int) -> int:
        """Free at least ``need`` GPU tokens from unlocked leaves, LRU first; returns tokens freed."""
        freed = 0
        heap = self._gpu_heap
        while freed < need and heap:
            stamp, _, node = heapq.heappop(heap)
            if (
                not node.on_gpu
                or node.lock_ref
                or node.gpu_children
                or node.last_access != stamp
                or self.nodes.get(node.key) is not node
            ):
                continue
            freed += node.ntok
            self._evict_gpu_node(node)
        self.evicted_tokens += freed
        if len(heap) > 4 * len(self.nodes) + 1024:
            self._rebuild_heaps()
        return freed

    def _evict_gpu_node(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None
        self.gpu_tokens -= node.ntok
        self.evictable_tokens -= node.ntok
        self.epoch += 1
        node.on_gpu = False
        parent.gpu_children -= 1
        if self.observer is not None:
            self.observer.removed(node.key, node.ntok)
        if self.host_capacity and self._host_room(node.ntok, keep=node):
            self.host_tokens += node.ntok
            if not node.children:
                heapq.heappush(self._host_heap, (node.last_access, id(node), node))
        else:
            self._delete_subtree(node)
        if parent is not self.root and parent.lock_ref == 0 and parent.gpu_children == 0 and parent.on_gpu:
            heapq.heappush(self._gpu_heap, (parent.last_access, id(parent), parent))

    def _host_room(self, ntok: int, keep: Node) -> bool:
        if ntok > self.host_capacity:
            return False
        heap = self._host_heap
        while self.host_tokens + ntok > self.host_capacity and heap:
            stamp, _, node = heapq.heappop(heap)
            if (
                node.on_gpu
                or node.children
                or node is keep
                or node.last_access != stamp
                or self.nodes.get(node.key) is not node
            ):
                continue
            self.host_tokens -= node.ntok
            self.host_dropped_tokens += node.ntok
            self._unlink(node)
        return self.host_tokens + ntok <= self.host_capacity

    def _unlink(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None
        parent.children.discard(node)
        del self.nodes[node.key]
        self.epoch += 1
        if not parent.on_gpu and not parent.children:
            heapq.heappush(self._host_heap, (parent.last_access, id(parent), parent))

    def _delete_subtree(self, node: Node) -> None:
        """Drop a node that just left the GPU, with its host-tier descendants."""
        stack = list(node.children)
        while stack:
            n = stack.pop()
            stack.extend(n.children)
            self.host_tokens -= n.ntok
            self.host_dropped_tokens += n.ntok
            del self.nodes[n.key]
        node.children.clear()
        self._unlink(node)

    def _rebuild_heaps(self) -> None:
        self._gpu_heap = [
            (n.last_access, id(n), n)
            for n in self.nodes.values()
            if n.on_gpu and n.lock_ref == 0 and n.gpu_children == 0
        ]
        heapq.heapify(self._gpu_heap)
        self._host_heap = [(n.last_access, id(n), n) for n in self.nodes.values() if not n.on_gpu and not n.children]
        heapq.heapify(self._host_heap)

    # ---- maintenance ----------------------------------------------------------------------
    def reset(self) -> None:
        assert self.gpu_tokens == self.evictable_tokens, "reset with locked nodes"
        observer = self.observer
        self.__init__(self.host_capacity, self.stamp_on_free)  # type: ignore[misc]
        self.observer = observer
        if observer is not None:
            observer.cleared()

    def check(self) -> None:
        """Recompute every counter from the tree and compare (tests and debugging)."""
        gpu = evictable = host = 0
        for key, n in self.nodes.items():
            assert n.key == key
            assert n.lock_ref >= 0
            p = n.parent
            assert p is not None and n in p.children
            assert p is self.root or self.nodes.get(p.key) is p
            if n.on_gpu:
                assert p.on_gpu
                gpu += n.ntok
                if n.lock_ref == 0:
                    evictable += n.ntok
            else:
                assert n.lock_ref == 0, "a locked node left the GPU"
                host += n.ntok
            assert n.gpu_children == sum(1 for c in n.children if c.on_gpu)
            assert n.lock_ref >= max((c.lock_ref for c in n.children), default=0)
        assert self.root.gpu_children == sum(1 for c in self.root.children if c.on_gpu)
        assert (gpu, evictable, host) == (self.gpu_tokens, self.evictable_tokens, self.host_tokens), (
            (gpu, evictable, host),
            (self.gpu_tokens, self.evictable_tokens, self.host_tokens),
        )
        assert host <= max(self.host_capacity, 0)
