"""``sglang-cache-aware``: a model of the SGLang router's ``cache_aware`` policy (sglang-router 0.3.2,
HTTP mode) with the defaults its Python launcher applies. It is the peer we are measured against,
so it keeps that policy's weaknesses on purpose (see ``SglangCacheAware``)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from policies.routers.base import Inflight, make_dispatch, slot_of, slots_of
from policies.routing import Router, RouterHook
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts, Slot

CHARS_PER_TOKEN = 4
"""The router matches request *text*; we see token-counted blocks, so a block of n tokens stands
for 4·n characters (the tree's size bound, 2^26 characters per worker, is about 16.8M tokens)."""


@dataclass(slots=True)
class _Node:
    parent: int | None
    chars: int
    tenants: dict[str, int] = field(default_factory=dict)
    """tenant -> last access epoch."""
    kids: dict[str, int] = field(default_factory=dict)
    """tenant -> how many child nodes that tenant holds (0: this node is one of its leaves)."""
    last: str | None = None
    """The cached last tenant, returned by a match that ends here."""


class ApproxTree:
    """The router's approximate radix tree, one per model, shared by all workers (tenants).

    Nodes are fingerprint blocks (the real tree's nodes are runs of characters that split where
    requests diverge; block keys are chained, so a block is a node with a fixed path). Each node
    maps tenant -> last access epoch; ``tenant_chars`` is each tenant's share. Eviction removes a
    tenant's least recently used leaves until its share is under the bound; a node no tenant holds
    is removed.
    """

    def __init__(self) -> None:
        self.nodes: dict[int, _Node] = {}
        self.tenant_chars: dict[str, int] = {}
        self._tenant_nodes: dict[str, set[int]] = {}
        self._epoch = 0

    def match(self, fp: Fingerprint) -> tuple[int, int, str | None]:
        """``(matched chars, input chars, tenant of the deepest matched node)``."""
        nodes = self.nodes
        matched = 0
        deepest: _Node | None = None
        total = 0
        walking = True
        for key, n in fp:
            total += n
            if walking:
                node = nodes.get(key)
                if node is None:
                    walking = False
                else:
                    matched += node.chars
                    deepest = node
        tenant = None
        if deepest is not None:
            tenant = deepest.last if deepest.last in deepest.tenants else next(iter(deepest.tenants), None)
        return matched, total * CHARS_PER_TOKEN, tenant

    def insert(self, fp: Fingerprint, tenant: str) -> None:
        self._epoch += 1
        epoch = self._epoch
        nodes = self.nodes
        held = self._tenant_nodes.setdefault(tenant, set())
        self.tenant_chars.setdefault(tenant, 0)
        parent: int | None = None
        for key, n in fp:
            node = nodes.get(key)
            if node is None:
                node = nodes[key] = _Node(parent, n * CHARS_PER_TOKEN)
            if tenant not in node.tenants:
                self.tenant_chars[tenant] += node.chars
                held.add(key)
                if parent is not None:
                    pnode = nodes[parent]
                    pnode.kids[tenant] = pnode.kids.get(tenant, 0) + 1
            node.tenants[tenant] = epoch
            node.last = tenant
            parent = key

    def evict(self, max_chars: int) -> None:
        """Each tenant over ``max_chars``: drop its LRU leaves (by epoch) until under the bound."""
        for tenant, count in list(self.tenant_chars.items()):
            if count <= max_chars:
                continue
            held = self._tenant_nodes[tenant]
            heap = [(self.nodes[k].tenants[tenant], k) for k in held if not self.nodes[k].kids.get(tenant)]
            heapq.heapify(heap)
            while self.tenant_chars[tenant] > max_chars and heap:
                _, key = heapq.heappop(heap)
                node = self.nodes[key]
                del node.tenants[tenant]
                held.discard(key)
                self.tenant_chars[tenant] -= node.chars
                if not node.tenants:
                    del self.nodes[key]
                if node.parent is not None:
                    pnode = self.nodes[node.parent]
                    pnode.kids[tenant] -= 1
                    if pnode.kids[tenant] == 0:
                        del pnode.kids[tenant]
                        heapq.heappush(heap, (pnode.tenants[tenant], node.parent))


def _tenant(slot: Slot) -> str:
    # With --dp-aware the router registers one worker per rank, "url@rank".
    return slot[0] if slot[1] is None else f"{slot[0]}@{slot[1]}"


class SglangCacheAware(Router):
    """The SGLang router's ``cache_aware`` rule, as sglang-router 0.3.2's launcher configures it.

    Formula, per request, over the candidate workers in list order (a worker = a backend, or one
    DP rank as with ``--dp-aware``), with ``load`` = the router's own in-flight count per worker:

    1. imbalanced iff ``max(load) − min(load) > balance_abs_threshold`` and
       ``max(load) > min(load) × balance_rel_threshold``: the first least-loaded worker
       (reason ``imbalance``); its text is still inserted into the tree for it.
    2. else walk the shared tree: ``match_rate = matched_chars / input_chars``; if
       ``match_rate > cache_threshold``, the deepest matched node's (last) tenant, not load-aware
       (reason ``prefix``); if that tenant is not a candidate, the first candidate, with no insert.
    3. else (a miss) the first least-loaded worker (ties go to the first in list order), reason
       ``least_wait``.
    4. insert the request under the chosen worker. Every ``eviction_interval_s`` (a background
       thread in the router; here checked as time passes) each worker's LRU leaves are evicted
       until it owns at most ``max_tree_chars`` characters.

    Parameters and defaults (the Python CLI's, which apply, not the Rust struct's):
    ``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5,
    ``eviction_interval_s`` 60, ``max_tree_chars`` 2^26.

    Approximations: the router matches the concatenated message *contents*; we match fingerprint
    blocks (which also cover roles and tools) at block granularity, with characters = tokens × 4.
    Match-time timestamp refreshes (1 in 8 in the router) are left out: the insert that follows
    refreshes the chosen worker's path anyway. Kept weaknesses: a shared system prompt makes most
    new requests "hits" for whichever worker touched it last; the gate counts requests, not
    tokens; the tree's bound (≈16.8M tokens per worker) is far above a real KV cache, so it
    believes in prefixes the engine evicted long ago.
    """

    name = "sglang-cache-aware"
    hooks: ClassVar[frozenset[RouterHook]] = frozenset({"dispatched", "finished"})

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        eviction_interval_s: float = 60.0,
        max_tree_chars: int = 2**26,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self.max_tree_chars = max_tree_chars
        self.trees: dict[str, ApproxTree] = {}
        self._inflight = Inflight()
        self._next_eviction: float | None = None
        self._insert: dict[str, tuple[str, Fingerprint]] = {}
        """rid -> (model, fingerprint) to insert when the decision is carried out."""

    def _maybe_evict(self, now: float) -> None:
        if self._next_eviction is None:
            self._next_eviction = now + self.eviction_interval_s
        if self.eviction_interval_s <= 0 or now < self._next_eviction:
            return
        for tree in self.trees.values():
            tree.evict(self.max_tree_chars)
        while self._next_eviction <= now:
            self._next_eviction += self.eviction_interval_s

    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        self._maybe_evict(now)
        workers = slots_of(backends)
        if not workers:
            return None
        loads = [self._inflight.count(s) for s, _ in workers]
        lo, hi = min(loads), max(loads)
        least = loads.index(lo)  # min_by_key: the first least-loaded worker
        scores = {"min_load": float(lo), "max_load": float(hi)}
        tree = self.trees.get(req.model)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            chosen, reason, insert = least, "imbalance", True
        else:
            matched, total, tenant = tree.match(req.fingerprint) if tree else (0, 0, None)
            rate = matched / total if total else 0.0
            scores["match_rate"] = rate
            if rate > self.cache_threshold:
                names = [_tenant(s) for s, _ in workers]
                if tenant in names:
                    chosen, reason, insert = names.index(tenant), "prefix", True
                else:  # the tenant left: the first healthy worker, and no insert
                    chosen, reason, insert = 0, "prefix", False
            else:
                chosen, reason, insert = least, "least_wait", True
        slot = workers[chosen][0]
        if insert:
            self._insert[req.rid] = (req.model, req.fingerprint)
        else:
            self._insert.pop(req.rid, None)
        return make_dispatch(req.rid, slot, reason, scores)

    def dispatched(self, req: RequestFacts, decision: Dispatch, now: float) -> None:
        pending = self._insert.pop(req.rid, None)
        if pending is not None:
            model, fp = pending
            tenant = _tenant(slot_of(decision))
            self.trees.setdefault(model, ApproxTree()).insert(fp, tenant)
        self._inflight.add(req.rid, slot_of(decision))

    def finished(self, rid: str, backend: str, outcome: Outcome, now: float) -> None:
        self._insert.pop(rid, None)
        self._inflight.remove(rid)
