"""``backends/sim/engine_state.py``: one request's engine-side state (prompt ends, target, KV held) and
one rank's (free tokens, eviction on demand, tokens generated so far while decoding)."""

from __future__ import annotations

from backends.sim.engine_state import PREFILL, RUNNING, WAITING, RankState, ReqState
from backends.sim.engine_types import EngineCounters, EngineRequest


def rank(cap: int = 1000) -> RankState:
    return RankState(0, cap, 0, 0.7, EngineCounters())


def test_a_new_request_waits_with_its_block_ends_and_at_least_one_output_token() -> None:
    rk = rank()
    r = ReqState(EngineRequest("r", [(1, 100), (2, 50), (3, 7)], output_tokens=0, max_new_tokens=20), 0, rk.cache.root)
    assert (r.state, r.ends, r.prompt_len, r.fill_len) == (WAITING, [100, 150, 157], 157, 157)
    assert (r.target, r.max_new, r.gen, r.kv, r.node) == (1, 20, 0, 0, rk.cache.root)  # a request yields a token
    empty = ReqState(EngineRequest("e", [], 3, 3), 0, rk.cache.root)
    assert (empty.ends, empty.prompt_len) == ([], 0)


def test_free_tokens_count_the_tree_and_the_private_kv_and_eviction_makes_room() -> None:
    rk = rank(1000)
    node, _ = rk.cache.put(rk.cache.root, 1, 300)
    rk.private = 200
    assert rk.free == 500
    assert rk.ensure_free(400) and rk.counters.evicted_tokens == 0  # enough already: nothing evicted
    assert rk.ensure_free(600) and rk.free == 800 and rk.counters.evicted_tokens == 300
    rk.cache.put(rk.cache.root, 2, 300)
    rk.cache.lock(rk.cache.nodes[2])  # a locked path cannot be evicted
    assert not rk.ensure_free(600) and rk.free == 500
    assert node.parent is rk.cache.root


def test_generated_tokens_and_private_kv_while_prefilling_and_decoding() -> None:
    rk = rank()
    r = ReqState(EngineRequest("r", [(1, 100)], 50, 50), 0, rk.cache.root)
    r.state, r.kv, r.pending, r.tree_len = PREFILL, 64, 36, 0
    assert rk.private_of(r) == 100 and rk.gen_of(r) == 0
    r.state, r.gen, r.step_base, r.tree_len = RUNNING, 1, 0, 100
    rk.steps = 9  # nine decode steps since it started running
    assert rk.gen_of(r) == 10
    assert rk.private_of(r) == 100 + 10 - 1 - 100  # the last token has no KV yet; the prompt is in the tree
