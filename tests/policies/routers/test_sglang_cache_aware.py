"""policies/routers/sglang_cache_aware.py: the approximate radix tree (match, insert, per-tenant LRU
eviction) and the router's bookkeeping around it (insert on dispatch, one tree per model, the eviction
clock). The documented routing rule, case by case, is ``tests/policies/test_routing_sglang.py``."""

from __future__ import annotations

from policies.routers import SglangCacheAware
from policies.routers.sglang_cache_aware import CHARS_PER_TOKEN, ApproxTree
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts
from tests.policies.routing_helpers import chain

W = [BackendView("w0"), BackendView("w1")]


def blocks(label: str, *sizes: int, parent: Fingerprint = ()) -> Fingerprint:
    out = parent
    for i, n in enumerate(sizes):
        out = chain(f"{label}{i}", n, out)
    return out


def _req(rid: str, fp: Fingerprint, model: str = "m") -> RequestFacts:
    return RequestFacts(rid=rid, model=model, prompt_tokens=sum(n for _, n in fp), fingerprint=fp)


# -- ApproxTree ------------------------------------------------------------------------------------


def test_an_empty_tree_matches_nothing_and_counts_the_input() -> None:
    fp = blocks("a", 100, 50)
    assert ApproxTree().match(fp) == (0, 150 * CHARS_PER_TOKEN, None)
    assert ApproxTree().match(()) == (0, 0, None)


def test_a_match_stops_at_the_first_block_not_in_the_tree() -> None:
    tree = ApproxTree()
    fp = blocks("a", 100, 100, 100)
    tree.insert(fp[:1], "w0")
    tree.insert(fp[2:], "w1")  # a later block present on its own does not extend the match
    assert tree.match(fp) == (100 * CHARS_PER_TOKEN, 300 * CHARS_PER_TOKEN, "w0")


def test_insert_counts_each_tenants_nodes_once() -> None:
    tree = ApproxTree()
    fp = blocks("a", 100, 200)
    tree.insert(fp, "w0")
    tree.insert(fp, "w0")
    tree.insert(fp[:1], "w1")
    assert tree.tenant_chars == {"w0": 300 * CHARS_PER_TOKEN, "w1": 100 * CHARS_PER_TOKEN}
    root = tree.nodes[fp[0][0]]
    assert root.kids == {"w0": 1} and set(root.tenants) == {"w0", "w1"}


def test_the_deepest_nodes_last_tenant_then_any_holder() -> None:
    tree = ApproxTree()
    fp = blocks("a", 100)
    tree.insert(fp, "w0")
    tree.insert(fp, "w1")
    assert tree.match(fp)[2] == "w1"
    node = tree.nodes[fp[0][0]]
    del node.tenants["w1"]  # the last tenant no longer holds it
    assert tree.match(fp)[2] == "w0"


def test_eviction_trims_only_tenants_over_the_bound_leaves_first() -> None:
    tree = ApproxTree()
    old, new = blocks("old", 100, 100), blocks("new", 100)
    tree.insert(old, "w0")
    tree.insert(new, "w0")
    tree.insert(blocks("x", 100), "w1")
    tree.evict(200 * CHARS_PER_TOKEN)
    assert tree.tenant_chars == {"w0": 200 * CHARS_PER_TOKEN, "w1": 100 * CHARS_PER_TOKEN}
    assert old[1][0] not in tree.nodes and old[0][0] in tree.nodes  # the oldest leaf went, not its root
    tree.evict(100 * CHARS_PER_TOKEN)  # the root became a leaf: it goes next, before the newer prompt
    assert old[0][0] not in tree.nodes and tree.match(new)[0] == 100 * CHARS_PER_TOKEN


def test_eviction_of_one_tenant_keeps_a_node_another_holds() -> None:
    tree = ApproxTree()
    fp = blocks("a", 100)
    tree.insert(fp, "w0")
    tree.insert(fp, "w1")
    tree.evict(0)
    assert tree.nodes == {}
    tree.insert(fp, "w0")
    tree.insert(blocks("b", 1000), "w1")
    tree.evict(500 * CHARS_PER_TOKEN)  # only w1 is over
    assert tree.match(fp) == (100 * CHARS_PER_TOKEN, 100 * CHARS_PER_TOKEN, "w0")


# -- SglangCacheAware ------------------------------------------------------------------------------


def test_no_worker_no_decision() -> None:
    assert SglangCacheAware().route(_req("r", blocks("a", 10)), [], 0.0) is None


def test_the_tree_learns_only_what_is_dispatched() -> None:
    router = SglangCacheAware()
    fp = blocks("a", 1000)
    d = router.route(_req("r", fp), W, 0.0)
    assert d is not None and d.scores == {"min_load": 0.0, "max_load": 0.0, "match_rate": 0.0}
    router.finished("r", d.backend, Outcome(), 1.0)  # ended without a dispatch (a retry dropped it)
    router.dispatched(_req("r", fp), Dispatch("r", "w1"), 1.0)
    assert "m" not in router.trees  # the pending insert went with it
    d = router.route(_req("s", fp), W, 2.0)
    assert d is not None
    router.dispatched(_req("s", fp), Dispatch("s", "w1"), 2.0)  # inserted under where it went
    again = router.route(_req("t", blocks("more", 10, parent=fp)), W, 3.0)
    assert again is not None and (again.backend, again.reason) == ("w1", "prefix")


def test_each_model_has_its_own_tree() -> None:
    router = SglangCacheAware()
    fp = blocks("a", 1000)
    d = router.route(_req("r", fp, model="m1"), W, 0.0)
    assert d is not None
    router.dispatched(_req("r", fp, model="m1"), Dispatch("r", "w1"), 0.0)
    other = router.route(_req("s", fp, model="m2"), W, 1.0)
    assert other is not None and other.reason == "least_wait" and other.scores["match_rate"] == 0.0
    assert set(router.trees) == {"m1"}


def test_the_eviction_clock_starts_at_the_first_request_and_catches_up() -> None:
    router = SglangCacheAware(eviction_interval_s=60.0, max_tree_chars=0)
    fp = blocks("a", 100)
    d = router.route(_req("r", fp), W, 1000.0)  # the first check only sets the clock: next at 1,060
    assert d is not None
    router.dispatched(_req("r", fp), d, 1000.0)
    router.route(_req("s", blocks("b", 1)), W, 1059.0)
    assert router.trees["m"].nodes
    router.route(_req("t", blocks("c", 1)), W, 1300.0)  # several intervals at once: one eviction
    assert router.trees["m"].nodes == {} and router._next_eviction == 1360.0  # the next one past now


def test_a_zero_interval_never_evicts() -> None:
    router = SglangCacheAware(eviction_interval_s=0.0, max_tree_chars=0)
    fp = blocks("a", 100)
    for now in (0.0, 1e6):
        d = router.route(_req(f"r{now}", fp), W, now)
        assert d is not None
        router.dispatched(_req(f"r{now}", fp), d, now)
    assert router.trees["m"].nodes
