"""``backends/sim/engine.py``: the engine model end to end: cache hits, LRU, retraction, chunked prefill, abort,
leaks, DP, HiCache, pass times. (The radix cache alone: test_radix.py.)"""

from __future__ import annotations

import itertools

import pytest

from backends.sim.engine import Engine, EngineEvent, EngineRequest, default_output_block
from backends.sim.profiles import get_profile
from backends.sim.tokenizer import Block, text_blocks

_keys = itertools.count(1)


def blocks(ntok: int, size: int = 256) -> list[Block]:
    """Fresh blocks (unique keys) of ``ntok`` tokens."""
    out = []
    while ntok > 0:
        n = min(size, ntok)
        out.append((next(_keys), n))
        ntok -= n
    return out


def run(engine: Engine, until: float = 1e9) -> list[EngineEvent]:
    events = engine.advance(until)
    engine.check_invariants()
    return events


def by_kind(events: list[EngineEvent], kind: str) -> dict[str, EngineEvent]:
    return {e.rid: e for e in events if e.kind == kind}


def tiny(**kw: int) -> Engine:
    return Engine(get_profile("tiny"), **kw)  # type: ignore[arg-type]


def test_repeated_prefix_hits_cache() -> None:
    e = tiny()
    prefix = text_blocks("x" * 4 * 3000, 256)  # the shared tokenizer's blocks
    e.submit(EngineRequest("a", prefix, 5, 5), 0.0)
    ev = run(e)
    assert by_kind(ev, "first_token")["a"].cached_tokens == 0
    e.submit(EngineRequest("b", [*prefix, *blocks(500)], 5, 5), 10.0)
    ev = run(e)
    first = by_kind(ev, "first_token")["b"]
    assert first.cached_tokens == 3000
    assert by_kind(ev, "finished")["b"].cached_tokens == 3000
    assert e.counters.prefill_cache_tokens == 3000
    assert e.counters.prefill_compute_tokens == 3000 + 500
    assert e.loads()[0].cache_hit_rate > 0


def test_next_turn_reuses_prompt_and_output() -> None:
    e = tiny()
    p1 = blocks(2000)
    e.submit(EngineRequest("t1", p1, 100, 200), 0.0)
    run(e)
    p2 = [*p1, default_output_block(p1, "t1", 99), *blocks(301)]
    e.submit(EngineRequest("t2", p2, 10, 200), 5.0)
    ev = run(e)
    assert by_kind(ev, "first_token")["t2"].cached_tokens == 2000 + 99


def test_engine_evicts_lru_conversation_not_running_one() -> None:
    e = tiny(kv_tokens=8000)
    a, b = blocks(2500), blocks(2500)
    e.submit(EngineRequest("a", a, 2, 2), 0.0)
    run(e)
    e.submit(EngineRequest("b", b, 2, 2), 1.0)
    run(e)
    e.submit(EngineRequest("a2", a, 2, 2), 2.0)  # touches a: b is now least recent
    run(e)
    e.submit(EngineRequest("big", blocks(4000), 2, 2), 3.0)
    run(e)
    e.submit(EngineRequest("a3", a, 2, 2), 4.0)
    e.submit(EngineRequest("b3", b, 2, 2), 4.0)
    ev = by_kind(run(e), "first_token")
    assert ev["a3"].cached_tokens == 2500
    assert ev["b3"].cached_tokens < 2500
    assert e.counters.evicted_tokens > 0


def test_retraction_under_decode_pressure_and_victim_finishes() -> None:
    e = tiny(kv_tokens=3000)
    for i in range(3):
        e.submit(EngineRequest(f"r{i}", blocks(200), 1000, 1000), 0.0)
    events = run(e)
    assert e.counters.retractions >= 1
    fin = by_kind(events, "finished")
    firsts = [x for x in events if x.kind == "first_token"]
    assert sorted(fin) == ["r0", "r1", "r2"]
    assert all(x.completion_tokens == 1000 and x.finish_reason == "length" for x in fin.values())
    assert len(firsts) == 3  # first_token once per request, even after a retraction
    victims = [x for x in fin.values() if x.retractions > 0]
    assert victims
    assert max(x.time for x in victims) == max(x.time for x in fin.values())
    assert e.counters.retracted_output_tokens > 0
    assert e.loads()[0].num_used_tokens == 0


def test_chunked_prefill_delays_decode() -> None:
    p = get_profile("tiny")

    def finish_time(with_long: bool) -> tuple[float, float]:
        e = Engine(p)
        e.submit(EngineRequest("dec", blocks(100), 60, 60), 0.0)
        run(e, 0.2)  # "dec" is decoding now
        assert 0 < e.generated("dec") < 60
        if with_long:
            e.submit(EngineRequest("long", blocks(6000), 1, 1), 0.2)
        ev = by_kind(run(e), "finished")
        return ev["dec"].time, ev["long"].time if with_long else 0.0

    alone, _ = finish_time(False)
    delayed, _ = finish_time(True)
    # three 2048-token chunks run before any further decode step of "dec"
    chunk_time = p.t0 + 2048 / p.r_lin
    assert delayed - alone > 3 * chunk_time


def test_chunks_are_capped_and_progress_is_visible() -> None:
    p = get_profile("tiny")
    e = Engine(p)
    e.submit(EngineRequest("long", blocks(5000), 3, 3), 0.0)
    t1 = e.next_time()
    assert t1 is not None
    assert e.complete() == []  # first chunk: no token yet
    assert e.counters.prefill_compute_tokens == 2 * p.chunked_prefill_size
    e.check_invariants()
    ev = run(e)
    assert [x.kind for x in ev] == ["first_token", "finished"]


def test_abort_frees_kv_and_keeps_prefix() -> None:
    e = tiny()
    prompt = blocks(3000)
    e.submit(EngineRequest("x", prompt, 500, 500), 0.0)
    run(e, 0.5)
    assert e.is_live("x") and e.generated("x") > 0
    assert e.loads()[0].num_used_tokens > 3000
    assert e.abort("x", 0.5)
    assert not e.is_live("x") and not e.abort("x", 0.5)
    e.check_invariants()
    assert e.loads()[0].num_used_tokens == 0
    assert e.loads()[0].extra["cached_tokens"] == 3000  # computed prompt stays cached, unlocked
    assert e.counters.aborted == 1
    # waiting request: leaves the queue
    e.submit(EngineRequest("y", blocks(60000), 5, 5), 1.0)
    e.submit(EngineRequest("z", blocks(100), 5, 5), 1.0)
    assert e.loads()[0].num_waiting_reqs >= 1
    assert e.abort("z", 1.0)
    ev = run(e)
    assert "z" not in by_kind(ev, "finished") and "y" in by_kind(ev, "finished")


def test_no_token_leaked_after_everything_ends() -> None:
    e = tiny(kv_tokens=20000)
    shared = blocks(1000)
    for i in range(30):
        e.submit(EngineRequest(f"q{i}", [*shared, *blocks(300 + 97 * i)], 20 + i, 64), i * 0.05)
        run(e, i * 0.05)
    run(e)
    assert e.idle()
    load = e.loads()[0]
    assert load.num_used_tokens == 0 and load.num_running_reqs == 0 and load.num_waiting_reqs == 0
    assert load.extra["cached_tokens"] == e.max_total_num_tokens - _free(e)
    assert e.flush_cache()
    assert e.loads()[0].extra["cached_tokens"] == 0


def _free(e: Engine) -> int:
    rk = e._ranks[0]
    return rk.free


def test_request_that_can_never_fit_is_aborted() -> None:
    e = tiny(kv_tokens=1000)
    e.submit(EngineRequest("huge", blocks(1000), 5, 5), 2.0)
    assert e.next_time() == 2.0
    ev = e.complete()
    assert ev[0].kind == "finished" and ev[0].finish_reason == "abort" and ev[0].message
    assert e.idle() and not e.is_live("huge")


def test_flush_cache_refused_while_busy() -> None:
    e = tiny()
    e.submit(EngineRequest("a", blocks(100), 50, 50), 0.0)
    assert not e.flush_cache()
    run(e)
    assert e.flush_cache()


def test_dp_pinned_rank_and_round_robin() -> None:
    e = Engine(get_profile("b300-dp8-fp8"))
    assert e.dp_size == 8 and len(e.loads()) == 8
    for i in range(8):
        e.submit(EngineRequest(f"rr{i}", blocks(1000), 2, 2), 0.0)
    e.submit(EngineRequest("pinned", blocks(1000), 2, 2, dp_rank=5), 0.0)
    ev = by_kind(run(e), "finished")
    assert [ev[f"rr{i}"].rank for i in range(8)] == list(range(8))
    assert ev["pinned"].rank == 5
    with pytest.raises(ValueError):
        e.submit(EngineRequest("bad", blocks(10), 1, 1, dp_rank=8), 100.0)


def test_dp_prefill_on_one_rank_delays_decode_on_another() -> None:
    def dec_finish(with_prefill: bool) -> float:
        e = Engine(get_profile("b300-dp8-fp8"))
        e.submit(EngineRequest("dec", blocks(1000), 40, 40, dp_rank=0), 0.0)
        run(e, 0.3)
        if with_prefill:
            e.submit(EngineRequest("pf", blocks(60000), 1, 1, dp_rank=3), 0.3)
        return by_kind(run(e), "finished")["dec"].time

    assert dec_finish(True) > dec_finish(False) + 1.0


def test_host_tier_hit_loads_instead_of_recomputing() -> None:
    p = get_profile("b300-tp8-fp8-hicache").with_(host_tier_tokens=100_000)
    e = Engine(p, kv_tokens=40_000)
    a = blocks(20000, 512)
    e.submit(EngineRequest("a1", a, 2, 2), 0.0)
    run(e)
    e.submit(EngineRequest("b1", blocks(30000, 512), 2, 2), 10.0)  # evicts a to the host tier
    run(e)
    assert e.loads()[0].extra["host_tokens"] > 0
    compute_before = e.counters.prefill_compute_tokens
    e.submit(EngineRequest("a2", [*a, *blocks(1000, 512)], 2, 2), 20.0)
    ev = run(e)
    assert by_kind(ev, "first_token")["a2"].cached_tokens == 20000
    assert e.counters.host_load_tokens > 0
    assert e.counters.prefill_compute_tokens - compute_before == 1000
    # the same run without a host tier recomputes
    e2 = Engine(get_profile("b300-tp8-fp8"), kv_tokens=40_000)
    e2.submit(EngineRequest("a1", a, 2, 2), 0.0)
    run(e2)
    e2.submit(EngineRequest("b1", blocks(30000, 512), 2, 2), 10.0)
    run(e2)
    e2.submit(EngineRequest("a2", [*a, *blocks(1000, 512)], 2, 2), 20.0)
    ev2 = run(e2)
    assert by_kind(ev2, "first_token")["a2"].cached_tokens < 20000
    t_host = by_kind(ev, "first_token")["a2"].time - 20.0
    t_recompute = by_kind(ev2, "first_token")["a2"].time - 20.0
    assert t_host < t_recompute / 3


def test_unbounded_never_evicts() -> None:
    e = tiny(unbounded=True)
    for i in range(40):
        e.submit(EngineRequest(f"u{i}", blocks(8000), 2, 2), float(i))
        run(e, float(i))
    run(e)
    assert e.counters.evicted_tokens == 0
    assert e.loads()[0].extra["cached_tokens"] == 40 * 8001


def test_decode_step_time_follows_the_formula() -> None:
    p = get_profile("b300-tp8-fp8")
    e = Engine(p)
    e.submit(EngineRequest("solo", blocks(100_000, 512), 3, 3), 0.0)
    ev = run(e)
    first = by_kind(ev, "first_token")["solo"].time
    done = by_kind(ev, "finished")["solo"].time
    cov = 1 - (1 - p.experts_per_token / p.num_experts)
    step1 = p.a + p.t_experts * cov + p.b + p.k_kv * 100_001
    step2 = step1 + p.k_kv
    assert done - first == pytest.approx(step1 + step2, rel=1e-9)
    u = 100_000
    chunks = [p.chunked_prefill_size] * (u // p.chunked_prefill_size) + [u % p.chunked_prefill_size]
    expected, c = 0.0, 0
    for n in chunks:
        expected += p.t0 + n / p.r_lin + p.k_attn * n * (c + n / 2) + p.k_kvb * c  # kv_b_proj re-expansion
        c += n
    assert first == pytest.approx(expected, rel=1e-9)
    assert p.solo_prefill_s(u, 0) == pytest.approx(first, rel=1e-9)


def test_solo_prefill_on_a_dp_rank_matches_the_engine_with_a_cached_prefix() -> None:
    p = get_profile("b300-dp8-fp8")
    e = Engine(p)
    history = blocks(140_032, 64)
    e.submit(EngineRequest("t1", history, 1, 1, dp_rank=3), 0.0)
    run(e)
    turn = [*history, default_output_block(history, "t1", 0), *blocks(2_496, 64)]
    t0 = 100.0
    e.submit(EngineRequest("t2", turn, 1, 1, dp_rank=3), t0)
    first = by_kind(run(e), "first_token")["t2"]
    assert first.cached_tokens == 140_032
    assert first.time - t0 == pytest.approx(p.solo_prefill_s(2_496, 140_032), rel=1e-9)
    # all 64 heads on one GPU: the same turn on TP8 is several times faster
    assert p.solo_prefill_s(2_496, 140_032) > 4 * get_profile("b300-tp8-fp8").solo_prefill_s(2_496, 140_032)


def test_lpm_prefers_longest_cached_prefix() -> None:
    p = get_profile("tiny").with_(schedule_policy="lpm", max_running_requests=1)
    e = Engine(p)
    shared = blocks(3000)
    e.submit(EngineRequest("warm", shared, 2, 2), 0.0)
    run(e)
    e.submit(EngineRequest("blocker", blocks(100), 200, 200), 1.0)
    e.submit(EngineRequest("cold", blocks(3000), 2, 2), 1.0)
    e.submit(EngineRequest("hot", [*shared, *blocks(10)], 2, 2), 1.0)
    firsts = [x.rid for x in run(e) if x.kind == "first_token"]
    assert firsts.index("hot") < firsts.index("cold")


def test_key_reused_with_another_size_is_a_miss_not_a_stall() -> None:
    """Hypothesis regression: r7 cached 5 blocks of 256 under keys that r8 then sent as 5 blocks of 100.

    Matching by key alone locked r7's 1280 tokens while r8 counted a 500-token prefix, so r8 needed
    1724 tokens of a 1500-token pool, was refused even into an empty batch, and the engine went idle with
    it queued. The mismatched key must be a miss: r8 computes its whole 800-token prompt and finishes.
    """
    p = get_profile("tiny").with_(chunked_prefill_size=512, max_prefill_tokens=1024)
    e = Engine(p, kv_tokens=1500)
    for i in range(7):
        e.submit(EngineRequest(f"r{i}", [], 1, 128), 0.0)
    e.submit(EngineRequest("r7", [(2_000_000 + k, 256) for k in range(5)], 1, 128), 0.0)
    own = [(10_008_000 + k, 100) for k in range(3)]
    e.submit(EngineRequest("r8", [*[(2_000_000 + k, 100) for k in range(5)], *own], 1, 128), 0.0)
    ev = []
    guard = 0
    while not e.idle():
        ev += run(e, e.next_time())  # type: ignore[arg-type]
        guard += 1
        assert guard < 1000
    done = by_kind(ev, "finished")
    assert sorted(done) == sorted(f"r{i}" for i in range(9))
    assert {x.finish_reason for x in done.values()} == {"stop"}
    assert done["r8"].cached_tokens == 0 and done["r8"].prompt_tokens == 800
    load = e.loads()[0]
    assert load.num_used_tokens == 0 and load.num_waiting_reqs == 0


def test_a_live_request_id_is_unique_and_free_again_once_it_ended() -> None:
    e = tiny()
    e.submit(EngineRequest("same", blocks(100), 3, 3), 0.0)
    with pytest.raises(ValueError, match="duplicate live request id 'same'"):
        e.submit(EngineRequest("same", blocks(100), 3, 3), 0.0)
    run(e)
    assert not e.is_live("same") and e.generated("same") == 0
    e.submit(EngineRequest("same", blocks(100), 3, 3), 10.0)
    assert by_kind(run(e), "finished")["same"].completion_tokens == 3


def test_an_idle_engine_has_nothing_to_do() -> None:
    e = tiny()
    assert e.idle() and e.next_time() is None
    assert e.complete() == [] and e.advance(1e9) == []


def test_the_output_is_clamped_to_what_the_pool_holds() -> None:
    e = tiny(kv_tokens=1000)
    e.submit(EngineRequest("long", blocks(100), 5000, 5000), 0.0)
    done = by_kind(run(e), "finished")["long"]
    assert (done.completion_tokens, done.finish_reason) == (899, "length")  # pool 1000 − prompt 100 − 1


def test_loads_report_throughput_and_the_running_cap() -> None:
    e = tiny()
    e.submit(EngineRequest("a", blocks(100), 50, 50), 0.0)
    run(e, 0.3)
    load = e.loads()[0]
    assert load.num_running_reqs == 1 and load.gen_throughput > 0
    assert load.max_running_requests == get_profile("tiny").max_running_requests
    assert load.extra["sum_context_tokens"] == 100 + e.generated("a")
