"""``backends/sim/engine_prefill.py``: SGLang's PrefillAdder on one rank: which waiting requests join the
next prefill batch and how much of each: FCFS without skipping the head, the running cap, the chunk and
batch token budgets, the chunked request continued first, LPM below 129 waiting, the output reservation."""

from __future__ import annotations

import itertools

from backends.sim.engine import Engine, EngineEvent, EngineRequest
from backends.sim.engine_state import PREFILL, ReqState
from backends.sim.profiles import get_profile

_keys = itertools.count(20_000_000)
TINY = get_profile("tiny")  # chunks of 2048, batches of 4096, pages of 16


def blocks(ntok: int, size: int = 256) -> list[tuple[int, int]]:
    out = []
    while ntok > 0:
        out.append((next(_keys), min(size, ntok)))
        ntok -= size
    return out


def firsts(events: list[EngineEvent]) -> list[str]:
    return [e.rid for e in events if e.kind == "first_token"]


def test_a_batch_fills_the_chunk_budget_and_chunks_the_request_that_overflows_it() -> None:
    e = Engine(TINY)
    e.submit(EngineRequest("a", blocks(1500), 5, 5), 0.0)  # starts a pass alone
    e.submit(EngineRequest("b", blocks(1500), 5, 5), 0.0)
    e.submit(EngineRequest("c", blocks(1500), 5, 5), 0.0)
    rk = e._ranks[0]
    assert e.counters.prefill_compute_tokens == 1500  # the pass under way: "a" alone
    assert firsts(e.complete()) == ["a"]
    # the next pass, formed as "a"'s ended: b whole, then what is left of the 2048 in whole pages: 544 of c
    assert e.counters.prefill_compute_tokens == 1500 + 1500 + 544
    assert rk.chunked is not None and rk.chunked.rid == "c" and rk.chunked.kv == 0 and rk.chunked.pending == 544
    assert firsts(e.complete()) == ["b"]
    assert rk.chunked is not None and rk.chunked.kv == 544  # c's first chunk is in; it goes first next
    assert firsts(e.complete()) == ["c"]
    e.check_invariants()


def test_the_head_is_never_skipped_for_a_smaller_request_behind_it() -> None:
    e = Engine(TINY, kv_tokens=3300)
    e.submit(EngineRequest("runner", blocks(200), 300, 300), 0.0)
    e.advance(0.1)
    e.submit(EngineRequest("big", blocks(3000), 5, 5), 0.1)  # 3000 + 5 + a page: not beside "runner"'s reservation
    e.submit(EngineRequest("small", blocks(50), 5, 5), 0.1)  # would fit at once
    early = e.advance(1.0)
    assert firsts(early) == [] and e.loads()[0].num_waiting_reqs == 2  # both wait behind the head
    late = e.advance(1e9)
    runner_done = next(x.time for x in late if x.kind == "finished" and x.rid == "runner")
    assert firsts(late) == ["big", "small"]
    assert min(x.time for x in late if x.kind == "first_token") > runner_done
    e.check_invariants()


def test_the_running_cap_bounds_the_batch() -> None:
    e = Engine(TINY.with_(max_running_requests=2))
    for rid in ("a", "b", "c"):
        e.submit(EngineRequest(rid, blocks(100), 40, 40), 0.0)
    e.advance(0.05)
    load = e.loads()[0]
    assert (load.num_running_reqs, load.num_waiting_reqs) == (2, 1)
    assert "c" in [e.rid for e in e.advance(1e9) if e.kind == "first_token"]


def test_an_empty_batch_takes_a_head_whose_output_reservation_does_not_fit() -> None:
    e = Engine(TINY, kv_tokens=1000)
    e.submit(EngineRequest("alone", blocks(500), 499, 499), 0.0)  # 500 + 499 + 16 > 1000, but it runs alone
    done = [x for x in e.advance(1e9) if x.kind == "finished"]
    assert [(x.rid, x.completion_tokens, x.finish_reason) for x in done] == [("alone", 499, "length")]


def test_the_reservation_for_running_requests_is_their_clipped_remaining_output_times_the_ratio() -> None:
    e = Engine(TINY.with_(clip_max_new_tokens=100))
    e.submit(EngineRequest("long", blocks(100), 10_000, 10_000), 0.0)
    e.submit(EngineRequest("short", blocks(100), 40, 40), 0.0)
    e.advance(0.1)
    rk = e._ranks[0]
    left = {r.rid: r.max_new - rk.gen_of(r) for r in rk.running.values()}
    expected = (min(left["long"], 100) + min(left["short"], 100)) * rk.ratio
    assert e._offset(rk) == expected and left["long"] > 100


def test_lpm_orders_by_cached_prefix_only_below_129_waiting() -> None:
    e = Engine(TINY.with_(schedule_policy="lpm"))
    shared = blocks(1000)
    e.submit(EngineRequest("warm", shared, 1, 1), 0.0)
    e.advance(1e9)
    rk = e._ranks[0]
    cold = ReqState(EngineRequest("cold", blocks(1000), 1, 1), 0, rk.cache.root)
    hot = ReqState(EngineRequest("hot", [*shared, *blocks(10)], 1, 1), 0, rk.cache.root)
    rk.waiting = [cold, hot]
    assert [r.rid for r in e._policy_order(rk)] == ["hot", "cold"]
    rk.waiting = [
        cold,
        *(ReqState(EngineRequest(f"f{i}", blocks(10), 1, 1), 0, rk.cache.root) for i in range(127)),
        hot,
    ]
    assert e._policy_order(rk)[0].rid == "cold" and len(rk.waiting) == 129  # FCFS past 128 waiting
    rk.waiting = []


def test_an_admitted_request_locks_its_cached_prefix_and_counts_it() -> None:
    e = Engine(TINY)
    prefix = blocks(512)
    e.submit(EngineRequest("first", prefix, 1, 1), 0.0)
    e.advance(1e9)
    rk = e._ranks[0]
    r = ReqState(EngineRequest("next", [*prefix, *blocks(100)], 1, 1), 0, rk.cache.root)
    rk.waiting = [r]
    items = e._form_prefill(rk)
    assert items == [(r, 100, 512)]  # 100 to compute on top of 512 cached
    assert r.state == PREFILL and r.cached == 512 and r.node.lock_ref == 1 and rk.waiting == []
    assert rk.hits[-1] == (512, 100)
