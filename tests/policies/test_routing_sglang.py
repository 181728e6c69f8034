"""``sglang-cache-aware`` (policies/routers/sglang_cache_aware.py) against its documented rule, on
hand-made cases: threshold, balance gate, first-worker tie-breaks, the shared-prefix weakness,
eviction."""

from __future__ import annotations

from policies.routers import SglangCacheAware
from policies.routers.base import mix64, stable_hash
from policies.routers.sglang_cache_aware import CHARS_PER_TOKEN, ApproxTree
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts


def chain(label: str, sizes: list[int], parent: Fingerprint = ()) -> Fingerprint:
    out = list(parent)
    for i, n in enumerate(sizes):
        prev = out[-1][0] if out else 0
        out.append((mix64(prev ^ stable_hash(f"{label}#{i}")), n))
    return tuple(out)


def req(rid: str, fp: Fingerprint) -> RequestFacts:
    return RequestFacts(rid=rid, model="m", prompt_tokens=sum(n for _, n in fp), fingerprint=fp)


W = [BackendView(name="w0"), BackendView(name="w1")]


def go(
    router: SglangCacheAware,
    rid: str,
    fp: Fingerprint,
    now: float = 0.0,
    *,
    finish: bool = True,
    workers: list[BackendView] = W,
) -> Dispatch:
    r = req(rid, fp)
    d = router.route(r, workers, now)
    assert d is not None
    router.dispatched(r, d, now)
    if finish:
        router.finished(rid, d.backend, Outcome(), now + 1)
    return d


def load(router: SglangCacheAware, backend: str, n: int) -> None:
    """``n`` requests in flight on ``backend`` (the router's own count, as its load guard keeps)."""
    for i in range(n):
        r = req(f"load-{backend}-{i}", chain(f"load-{backend}-{i}", [10]))
        router._inflight.add(r.rid, (backend, None))  # a backend without DP is the slot (name, None)


def test_sequential_distinct_prompts_all_go_to_the_first_worker() -> None:
    # The observed 0.3.2 behaviour: at low concurrency every load is 0, a miss goes to the first
    # least-loaded worker, and a repeat hits the same worker: 18 requests over 3 prompts -> 18/0.
    router = SglangCacheAware()
    prompts = [chain(f"p{i}", [100, 100]) for i in range(3)]
    picks = [go(router, f"r{k}", prompts[k % 3], float(k)).backend for k in range(18)]
    assert picks == ["w0"] * 18


def test_miss_goes_to_the_least_loaded_first_in_order() -> None:
    router = SglangCacheAware()
    load(router, "w0", 1)
    d = go(router, "a", chain("a", [100]))
    assert (d.backend, d.reason) == ("w1", "least_wait")
    three = [BackendView(name=n) for n in ("w0", "w1", "w2")]
    load(router, "w1", 1)
    d = go(router, "b", chain("b", [100]), workers=three)
    assert d.backend == "w2"  # w0 and w1 have one each


def test_match_rate_threshold_is_strict() -> None:
    router = SglangCacheAware()
    base = chain("doc", [30])
    go(router, "seed", base)  # w0 now holds the 30-token doc
    load(router, "w0", 1)  # w0 busier, so a miss would go to w1
    at = go(router, "at", chain("rest-a", [70], base))  # 30/100 = 0.3: not > 0.3
    assert (at.backend, at.reason) == ("w1", "least_wait")
    assert at.scores["match_rate"] == 0.3
    load(router, "w1", 2)  # now w1 is the busier one
    above = go(router, "above", chain("rest-b", [60], base))  # 30/90 > 0.3
    # A hit goes to the doc node's last tenant (w1 inserted through it last), load regardless.
    assert (above.backend, above.reason) == ("w1", "prefix")


def test_prefix_hit_ignores_load_below_the_gate() -> None:
    router = SglangCacheAware()
    conv = chain("conv", [1000])
    go(router, "seed", conv)
    load(router, "w0", 60)  # 60 - 0 is not > 64: balanced, so the hit wins despite the load
    d = go(router, "hit", chain("more", [100], conv))
    assert (d.backend, d.reason) == ("w0", "prefix")


def test_imbalance_needs_both_thresholds() -> None:
    conv = chain("conv", [1000])
    router = SglangCacheAware()
    go(router, "seed", conv)
    load(router, "w0", 70)
    load(router, "w1", 5)  # 70 - 5 > 64 and 70 > 7.5: imbalanced
    d = go(router, "x", chain("more", [100], conv))
    assert (d.backend, d.reason) == ("w1", "imbalance")
    # The text was still inserted for w1: it now owns the deepest node, and the next request follows.
    router._inflight = type(router._inflight)()
    d = go(router, "y", chain("more2", [10], chain("more", [100], conv)))
    assert (d.backend, d.reason) == ("w1", "prefix")

    router = SglangCacheAware()
    go(router, "seed", conv)
    load(router, "w0", 200)
    load(router, "w1", 135)  # 65 > 64 but 200 < 135 × 1.5: balanced, the prefix decides
    d = go(router, "z", chain("more", [100], conv))
    assert (d.backend, d.reason) == ("w0", "prefix")


def test_shared_system_prompt_dominates_new_conversations() -> None:
    # A faithful weakness: new conversations whose text is mostly a shared system prompt are
    # "hits" for whichever worker last touched it, so at low load they all land together.
    router = SglangCacheAware()
    system = chain("system", [15_000])
    picks = {go(router, f"c{i}", chain(f"task{i}", [10_000], system), float(i)).backend for i in range(20)}
    assert picks == {"w0"}


def test_last_tenant_of_the_deepest_node_wins() -> None:
    router = SglangCacheAware()
    system = chain("system", [1000])
    load(router, "w0", 1)
    first = go(router, "a", chain("a", [100], system))  # miss: least loaded = w1
    assert first.backend == "w1"
    router._inflight = type(router._inflight)()
    load(router, "w1", 1)
    second = go(router, "b", chain("b", [5000], system))  # 1000/6000 < 0.3: miss -> w0
    assert second.backend == "w0"
    d = go(router, "c", chain("c", [100], system))  # 1000/1100 > 0.3: the system node's last tenant
    assert (d.backend, d.reason) == ("w0", "prefix")


def test_a_tenant_that_is_not_a_candidate_falls_back_to_the_first_without_insert() -> None:
    router = SglangCacheAware()
    conv = chain("conv", [1000])
    go(router, "seed", conv, workers=[BackendView(name="gone"), *W])
    assert router.trees["m"].match(conv)[2] == "gone"
    d = go(router, "x", chain("more", [10], conv))
    assert (d.backend, d.reason) == ("w0", "prefix")
    assert router.trees["m"].match(chain("more", [10], conv))[0] == 1000 * CHARS_PER_TOKEN


def test_dp_aware_workers_are_ranks() -> None:
    router = SglangCacheAware()
    dp = [BackendView(name="node", dp_size=4)]
    d = go(router, "a", chain("a", [100]), workers=dp, finish=False)
    assert (d.backend, d.rank) == ("node", 0)
    d = go(router, "b", chain("b", [100]), workers=dp, finish=False)
    assert d.rank == 1  # rank 0 is busier
    d = go(router, "a2", chain("a2", [10], chain("a", [100])), workers=dp)
    assert (d.rank, d.reason) == (0, "prefix")


def test_eviction_runs_every_interval_and_trims_lru_leaves() -> None:
    router = SglangCacheAware(max_tree_chars=3500 * CHARS_PER_TOKEN)
    old = chain("old", [1000, 1000])
    go(router, "old", old, now=0.0)
    new = chain("new", [1000, 1000])
    go(router, "new", new, now=10.0)
    tree = router.trees["m"]
    assert tree.tenant_chars["w0"] == 4000 * CHARS_PER_TOKEN
    go(router, "tick", chain("t", [1]), now=59.0)  # not yet 60 s: no eviction
    assert tree.match(old)[0] == 2000 * CHARS_PER_TOKEN
    go(router, "tick2", chain("t", [1]), now=61.0)
    assert tree.tenant_chars["w0"] == 3001 * CHARS_PER_TOKEN  # one 1000-token leaf was enough
    assert tree.match(old)[0] == 1000 * CHARS_PER_TOKEN  # its leaf went first, the root block stays
    assert tree.match(new)[0] == 2000 * CHARS_PER_TOKEN


def test_tree_removes_nodes_no_tenant_holds() -> None:
    tree = ApproxTree()
    a = chain("a", [10, 10, 10])
    tree.insert(a, "w0")
    tree.insert(a[:1], "w1")
    tree.evict(0)
    assert tree.nodes == {} and tree.tenant_chars == {"w0": 0, "w1": 0}
