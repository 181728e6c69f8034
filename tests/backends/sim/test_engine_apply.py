"""``backends/sim/engine_apply.py``: what a completed pass does: prefill chunks inserted into the radix cache
as they are computed, the first token, decode steps, and a finished request's prompt + output inserted
(its own blocks, or one block for the output) with its events and counters."""

from __future__ import annotations

import itertools

from backends.sim.engine import Engine, EngineEvent, EngineRequest, default_output_block
from backends.sim.profiles import get_profile

_keys = itertools.count(30_000_000)
TINY = get_profile("tiny")


def blocks(ntok: int, size: int = 256) -> list[tuple[int, int]]:
    out = []
    while ntok > 0:
        out.append((next(_keys), min(size, ntok)))
        ntok -= size
    return out


def finished(events: list[EngineEvent]) -> dict[str, EngineEvent]:
    return {e.rid: e for e in events if e.kind == "finished"}


def test_each_chunk_inserts_its_whole_blocks_and_moves_the_lock_to_them() -> None:
    e = Engine(TINY)
    prompt = blocks(5000)
    e.submit(EngineRequest("long", prompt, 3, 3), 0.0)
    assert e.complete() == []  # the first 2048 tokens: 8 whole blocks of 256
    rk = e._ranks[0]
    r = e._reqs["long"]
    assert (r.kv, r.nblk, r.tree_len) == (2048, 8, 2048)
    assert rk.cache.match(prompt) == (8, 0) and r.node is rk.cache.nodes[prompt[7][0]]
    assert r.node.lock_ref == 1 and rk.cache.evictable_tokens == 0  # locked while it runs
    e.check_invariants()


def test_a_finished_request_leaves_its_prompt_and_output_cached_and_unlocked() -> None:
    e = Engine(TINY)
    prompt = blocks(1000)
    e.submit(EngineRequest("r", prompt, 40, 100), 0.0)
    events = e.advance(1e9)
    kinds = [(x.kind, x.rid) for x in events]
    assert kinds == [("first_token", "r"), ("finished", "r")]
    done = finished(events)["r"]
    assert (done.prompt_tokens, done.completion_tokens, done.finish_reason) == (1000, 40, "stop")  # 40 < 100
    out = default_output_block(prompt, "r", 39)  # the last output token holds no KV
    rk = e._ranks[0]
    assert rk.cache.match([*prompt, out]) == (len(prompt) + 1, 0)
    assert rk.cache.evictable_tokens == rk.cache.gpu_tokens == 1039 and rk.private == 0
    c = e.counters
    assert (c.requests, c.prompt_tokens, c.generation_tokens, c.cached_tokens) == (1, 1000, 40, 0)


def test_the_callers_final_blocks_are_inserted_up_to_what_has_kv() -> None:
    e = Engine(TINY)
    prompt = blocks(512)
    final = [*prompt, (901, 10), (902, 10), (903, 10)]  # prompt + 30 tokens, but only 19 output tokens have KV
    e.submit(EngineRequest("r", prompt, 20, 20, final_blocks=final), 0.0)
    assert finished(e.advance(1e9))["r"].finish_reason == "length"  # 20 of max 20
    cache = e._ranks[0].cache
    assert cache.match(final) == (3, 0)  # the two blocks of prompt, then 901 (10 tokens); 902 would pass 19
    assert 902 not in cache.nodes and cache.gpu_tokens == 522


def test_a_final_block_whose_key_names_another_prefix_ends_the_insertion() -> None:
    e = Engine(TINY)
    prompt = blocks(256)
    e.submit(EngineRequest("a", prompt, 6, 6, final_blocks=[*prompt, (777, 5)]), 0.0)
    e.advance(1e9)
    assert e._ranks[0].cache.nodes[777].ntok == 5  # 5 output tokens with KV: the whole block
    e.submit(EngineRequest("b", prompt, 30, 30, final_blocks=[*prompt, (777, 20), (778, 5)]), 10.0)
    e.advance(1e9)  # 777 is cached as a 5-token block: "b"'s 20-token 777 is malformed, and 778 is not inserted
    cache = e._ranks[0].cache
    assert cache.nodes[777].ntok == 5 and 778 not in cache.nodes
    e.check_invariants()


def test_one_output_token_finishes_at_the_prefill_and_the_first_token_is_told_once() -> None:
    e = Engine(TINY)
    e.submit(EngineRequest("one", blocks(300), 1, 1), 0.0)
    events = e.advance(1e9)
    assert [x.kind for x in events] == ["first_token", "finished"]
    assert events[0].time == events[1].time and e._ranks[0].steps == 0  # no decode step ran
    assert finished(events)["one"].completion_tokens == 1


def test_decode_steps_count_tokens_into_the_throughput_window() -> None:
    e = Engine(TINY)
    e.submit(EngineRequest("a", blocks(100), 30, 30), 0.0)
    e.submit(EngineRequest("b", blocks(100), 30, 30), 0.0)
    e.advance(1e9)
    rk = e._ranks[0]
    assert rk.gen_window_sum == 60 and e.counters.generation_tokens == 60  # all within the last 10 s
    assert e.loads()[0].gen_throughput == 6.0  # 60 tokens over the 10 s window
    later = rk.gen_window[-1][0] + 11.0
    e._note_gen(rk, later, 1)  # 11 s later: the old tokens have left the window
    assert rk.gen_window_sum == 1
