"""``backends/sim/engine_memory.py``: giving KV back: an abort in every state (queued, still being
tokenised, prefilling a chunk, running), an abort the engine decides itself, and retraction under decode
memory pressure (SGLang's ``retract_decode``: which victims, where they go, what they recompute)."""

from __future__ import annotations

import itertools

import pytest

from backends.sim.engine import Engine, EngineEvent, EngineRequest
from backends.sim.engine_state import RUNNING, WAITING
from backends.sim.profiles import get_profile

_keys = itertools.count(10_000_000)


def blocks(ntok: int, size: int = 256) -> list[tuple[int, int]]:
    out = []
    while ntok > 0:
        out.append((next(_keys), min(size, ntok)))
        ntok -= size
    return out


def settle(e: Engine, until: float = 1e9) -> list[EngineEvent]:
    events = e.advance(until)
    e.check_invariants()
    return events


def test_aborting_a_request_still_being_tokenised_drops_it_before_the_scheduler_sees_it() -> None:
    e = Engine(get_profile("tiny").with_(request_overhead_s=1.0))
    e.submit(EngineRequest("t", blocks(100), 5, 5), 0.0)
    assert e.abort("t", 0.5) and e.counters.aborted == 1
    assert settle(e) == [] and e.idle()
    assert e.loads()[0].num_waiting_reqs == 0 and e.counters.requests == 0


def test_aborting_the_chunked_request_frees_its_partial_kv_and_keeps_what_was_inserted() -> None:
    p = get_profile("tiny")
    e = Engine(p)
    prompt = blocks(5000)
    e.submit(EngineRequest("long", prompt, 5, 5), 0.0)
    assert e.complete() == []  # the first pass: two chunks, no token yet
    rk = e._ranks[0]
    assert rk.chunked is not None and rk.private > 0
    assert e.abort("long", e.next_time() or 0.0)
    assert rk.chunked is None and rk.private == 0
    e.check_invariants()
    computed = rk.cache.evictable_tokens
    assert 0 < computed <= 2 * p.chunked_prefill_size  # the whole blocks computed stay cached, unlocked


def test_aborting_a_running_request_releases_its_context() -> None:
    e = Engine(get_profile("tiny"))
    e.submit(EngineRequest("r", blocks(1000), 200, 200), 0.0)
    settle(e, 0.3)
    rk = e._ranks[0]
    assert "r" in rk.running and rk.ctx_sum > 1000
    assert e.abort("r", 0.3)
    assert rk.running == {} and rk.ctx_sum == 0 and rk.private == 0
    assert not e.abort("r", 0.3) and e.counters.aborted == 1


def test_the_engines_own_abort_is_reported_as_finished_abort_with_its_message() -> None:
    e = Engine(get_profile("tiny"))
    e.submit(EngineRequest("r", blocks(300), 50, 50), 0.0)
    settle(e, 0.2)
    gen = e.generated("r")
    rk = e._ranks[0]
    e._abort_with_event(rk, rk.running["r"], 0.2, "out of memory")
    (event,) = e.complete()
    assert (event.kind, event.rid, event.finish_reason, event.message) == ("finished", "r", "abort", "out of memory")
    assert (event.prompt_tokens, event.completion_tokens, event.time) == (300, gen, 0.2)
    assert not e.is_live("r")


def test_retraction_takes_the_fewest_output_tokens_first_and_requeues_them_at_the_back() -> None:
    p = get_profile("tiny")
    e = Engine(p, kv_tokens=2400)  # 400 + 400 prompt tokens + 1,000 output each cannot all fit
    e.submit(EngineRequest("old", blocks(400), 1000, 1000), 0.0)
    settle(e, 0.5)  # "old" has decoded for a while
    e.submit(EngineRequest("young", blocks(400), 1000, 1000), 0.5)
    e.submit(EngineRequest("big", blocks(1500), 10, 10), 0.5)  # waits: no room for it yet
    rk = e._ranks[0]
    for _ in range(5000):
        if e.counters.retractions:
            break
        settle(e, e.next_time())  # type: ignore[arg-type]
    young = e._reqs["young"]
    assert young.state == WAITING and young.retractions == 1
    assert [r.rid for r in rk.waiting] == ["big", "young"]  # appended behind what already waited
    assert e._reqs["old"].state == RUNNING and rk.gen_of(e._reqs["old"]) > young.gen  # more output: kept
    assert young.fill_len == young.prompt_len + young.gen  # re-prefills prompt + output so far
    assert e.counters.retracted_input_tokens == 400 and e.counters.retracted_output_tokens == young.gen
    assert rk.ratio > p.init_new_token_ratio * p.min_new_token_ratio_factor  # re-estimated, not decayed


def test_the_new_token_ratio_decays_per_decode_step_and_resets_when_idle() -> None:
    p = get_profile("tiny")
    e = Engine(p)
    e.submit(EngineRequest("r", blocks(100), 30, 30), 0.0)
    settle(e, 0.2)
    rk = e._ranks[0]
    decay = (p.init_new_token_ratio - p.init_new_token_ratio * p.min_new_token_ratio_factor) / 600
    assert rk.ratio == pytest.approx(p.init_new_token_ratio - decay * (rk.steps + 1))  # one step in flight
    settle(e)
    assert rk.ratio == p.init_new_token_ratio
