"""The collapse, in a test: a closed loop of multi-turn conversations sent straight to one engine.

Each turn resends the previous prompt + the previous answer + a tool result, waits for the answer,
then thinks for a while. With the conversations' total context under C, every turn hits the cache;
over C, LRU evicts idle conversations, turns recompute, and throughput falls.
``run_closed_loop`` is also the engine micro-benchmark quoted in the engine report.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from backends.sim.engine import Engine, EngineRequest, default_output_block
from backends.sim.profiles import get_profile
from backends.sim.tokenizer import Block


@dataclass
class LoopResult:
    sim_seconds: float
    turns: int
    prompt_tokens: int
    generation_tokens: int
    prefill_compute_tokens: int
    prefill_cache_tokens: int
    retractions: int
    evicted_tokens: int
    ttfts: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        total = self.prefill_compute_tokens + self.prefill_cache_tokens
        return self.prefill_cache_tokens / total if total else 0.0

    @property
    def tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.generation_tokens) / self.sim_seconds


def _blocks(rng: random.Random, ntok: int, block: int) -> list[Block]:
    out = []
    while ntok > 0:
        n = min(block, ntok)
        out.append((rng.getrandbits(63), n))  # fresh content: keys unique to this text
        ntok -= n
    return out


def run_closed_loop(
    engine: Engine,
    *,
    conversations: int,
    start_tokens: tuple[int, int],
    max_tokens: int,
    tool_tokens: int,
    output_tokens: tuple[int, int],
    think_s: tuple[float, float],
    seconds: float,
    block: int = 512,
    shared_prefix: int = 0,
    seed: int = 1,
) -> LoopResult:
    """Drive ``engine`` for ``seconds`` of engine time; counters are read at the end."""
    rng = random.Random(seed)
    shared = _blocks(rng, shared_prefix, block)
    prompts: dict[int, list[Block]] = {}
    outs: dict[str, tuple[int, int]] = {}  # rid -> (conversation, output tokens)
    sent_at: dict[str, float] = {}
    arrivals: list[tuple[float, int]] = []  # (time, conversation)
    res = LoopResult(seconds, 0, 0, 0, 0, 0, 0, 0)
    turn_no = 0

    def fresh(c: int) -> None:
        prompts[c] = shared + _blocks(rng, rng.randint(*start_tokens) - shared_prefix, block)

    for c in range(conversations):
        fresh(c)
        heapq.heappush(arrivals, (rng.uniform(0, think_s[1]), c))
    now = 0.0
    while now < seconds:
        t_engine = engine.next_time()
        t_arrival = arrivals[0][0] if arrivals else None
        if t_engine is not None and (t_arrival is None or t_engine <= t_arrival):
            now = t_engine
            if now >= seconds:
                break
            for ev in engine.complete():
                if ev.kind == "first_token":
                    res.ttfts.append(ev.time - sent_at[ev.rid])
                    continue
                c, out = outs.pop(ev.rid)
                res.turns += 1
                res.prompt_tokens += ev.prompt_tokens
                res.generation_tokens += ev.completion_tokens
                prompt = prompts[c]
                nxt = [*prompt, default_output_block(prompt, ev.rid, out - 1)]
                nxt += _blocks(rng, tool_tokens + 1, block)
                prompts[c] = nxt
                if sum(n for _, n in nxt) + output_tokens[1] > max_tokens:
                    fresh(c)
                heapq.heappush(arrivals, (now + rng.uniform(*think_s), c))
        elif t_arrival is not None:
            now, c = heapq.heappop(arrivals)
            if now >= seconds:
                break
            engine.advance(now)  # nothing due before `now` (checked above)
            turn_no += 1
            rid = f"c{c}-t{turn_no}"
            out = rng.randint(*output_tokens)
            outs[rid] = (c, out)
            sent_at[rid] = now
            engine.submit(EngineRequest(rid, prompts[c], out, max(out, 2048)), now)
        else:
            break
    k = engine.counters
    res.prefill_compute_tokens = k.prefill_compute_tokens
    res.prefill_cache_tokens = k.prefill_cache_tokens
    res.retractions = k.retractions
    res.evicted_tokens = k.evicted_tokens
    return res


def _tiny_loop(conversations: int, kv_tokens: int | None, unbounded: bool = False) -> tuple[LoopResult, Engine]:
    engine = Engine(get_profile("tiny"), kv_tokens=kv_tokens, unbounded=unbounded)
    res = run_closed_loop(
        engine,
        conversations=conversations,
        start_tokens=(2000, 3000),
        max_tokens=8000,
        tool_tokens=300,
        output_tokens=(50, 150),
        think_s=(1.0, 3.0),
        seconds=240.0,
        block=64,
    )
    engine.check_invariants()
    return res, engine


def test_collapse_over_capacity_and_not_under() -> None:
    # Same load; 16 conversations hold ~16 × 5k ≈ 80k tokens of live history.
    under, _ = _tiny_loop(16, kv_tokens=200_000)
    over, eng = _tiny_loop(16, kv_tokens=40_000)
    ceiling, _ = _tiny_loop(16, kv_tokens=None, unbounded=True)
    # Under C only finished conversations' leftovers are evicted: the run equals a perfect cache.
    assert (under.turns, under.prefill_compute_tokens) == (ceiling.turns, ceiling.prefill_compute_tokens)
    assert ceiling.evicted_tokens == 0 and under.evicted_tokens > 0
    assert under.hit_rate > 0.85
    assert over.evicted_tokens > 0
    assert over.hit_rate < under.hit_rate - 0.3
    assert over.prefill_compute_tokens > 2 * under.prefill_compute_tokens
    assert over.tokens_per_s < 0.7 * under.tokens_per_s
    assert sorted(over.ttfts)[len(over.ttfts) // 2] > 2 * sorted(under.ttfts)[len(under.ttfts) // 2]
    assert eng.loads()[0].cache_hit_rate < 0.6


def test_more_conversations_than_capacity_lowers_throughput() -> None:
    # Fixed pool: going from 4 to 16 conversations crosses C; tokens/s must not scale with load.
    small, _ = _tiny_loop(4, kv_tokens=40_000)
    big, _ = _tiny_loop(16, kv_tokens=40_000)
    assert small.hit_rate > 0.85
    assert big.hit_rate < 0.2
    assert big.tokens_per_s < 0.6 * 4 * small.tokens_per_s  # 4× the load, far less than 4× the tokens


def _b300_loop(profile: str, conversations: int) -> tuple[LoopResult, float]:
    import time

    engine = Engine(get_profile(profile))
    t = time.perf_counter()
    res = run_closed_loop(
        engine,
        conversations=conversations,
        start_tokens=(20_000, 60_000),
        max_tokens=220_000,
        tool_tokens=4_000,
        output_tokens=(200, 1500),
        think_s=(2.0, 8.0),
        seconds=1200.0,
        block=512,
        shared_prefix=15_000,
    )
    wall = time.perf_counter() - t
    engine.check_invariants()
    return res, wall


def test_twenty_b300_minutes_run_in_seconds_and_bf16_thrashes_first() -> None:
    fp8, wall = _b300_loop("b300-tp8-fp8", 48)
    bf16, _ = _b300_loop("b300-tp8-bf16", 48)
    assert fp8.turns > 500
    assert wall < 5.0, f"20 simulated minutes took {wall:.1f} s"
    # same load: half the KV per token means fewer evictions and more hits
    assert fp8.hit_rate > bf16.hit_rate + 0.2
    assert fp8.tokens_per_s > 1.5 * bf16.tokens_per_s
