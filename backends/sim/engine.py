"""Engine model of one SGLang (0.5.23) scheduler, pure and clock-driven.

No I/O, no asyncio, no wall clock: time is engine seconds, passed in. The engine runs one forward
pass at a time (a prefill batch, or a decode step for every running request); ``next_time()`` is
when the current pass ends and ``complete()`` applies it, returns the events that happened at that
moment and starts the next pass if there is work. The live twin sleeps until ``next_time()``
(scaled); the discrete-event simulator pops it from a heap. Both run the same object.

What is modelled (per rank; ``dp_size`` ranks under DP attention, stepping together):
- a KV pool of C tokens; a radix cache of token blocks (``radix.py``) whose paths running requests
  lock; LRU eviction of unlocked leaves only when an allocation needs more than is free; the
  computed prompt blocks are inserted after every prefill chunk (``cache_unfinished_req``) and
  prompt + output on finish (``cache_finished_req``); optional host tier (HiCache) that catches
  evicted blocks and loads them back at ``host_load_tokens_per_s`` instead of recomputing;
- the default loop: prefill first whenever a batch can be formed, else one decode step;
  PrefillAdder admission (FCFS, or LPM below 128 waiting): the head needs
  ``extend + min(max_new, 4096) + page`` < free + evictable − Σ_running min(left, 4096) ×
  new_token_ratio, the head is never skipped; one chunked request at a time, continued first;
  ``max_prefill_tokens``, ``chunked_prefill_size`` and ``max_running_requests``;
- retraction before a decode step that cannot get one token per request: victims with the fewest
  output tokens (then the longest input) lose their KV (the computed prompt stays cached,
  unlocked), go to the back of the queue (0.5.23 appends) and re-prefill prompt + output so far;
  new_token_ratio decays over 600 steps, resets when idle and is re-estimated on retraction;
- time (see ``profiles.py``): prefill ``(t0 + Σu/r_lin + k_attn·Σu·(c + u/2) + k_kvb·Σc) / efficiency``
  plus host loads (``k_kvb``: the per-chunk ``kv_b_proj`` re-expansion of the cached prefix); decode
  ``a + t_experts·coverage(B) + b·min(B, b_cap) + k_kv·Σctx``; a DP pass lasts as long as its
  slowest rank; under context-parallel prefill (``prefill_cp_size``) the attention time of every
  rank of a CP group prefilling in the pass is summed (the group shares its GPUs);
- options (profile fields, off unless a profile sets them; derivations in ``profiles.py``):
  speculative decoding (a verify step of d + 1 tokens per request yielding the accept length),
  mixed chunk (``--enable-mixed-chunk``: the running batch decodes one token inside a prefill pass),
  SGLang's PrefillDelayer under DP attention (``managers/prefill_delayer.py``: while some ranks
  could prefill and others could not, prefills are held up to ``max_delay_passes``), and a
  per-request overhead before the scheduler sees a request (tokenisation, HTTP).

Simplified: tokens are accounted exactly, not in pages (page size only rounds chunk ends and
pads admission); the cache matches whole blocks (the caller's block size is the match granularity);
the overlap scheduler, CUDA-graph padding, the delayer's token-usage watermark, the sharing of the
expert-parallel MoE between ranks prefilling in one pass, and the in-batch prefix de-duplication of
LPM are not modelled; speculative decoding is emulated as one token per step at the verify step's
time over the accept length; the host tier is exclusive (a block loaded back
leaves it) and its load time is added to the pass, not overlapped; a request's last output token
holds no KV (as in SGLang) so at most prompt + output − 1 tokens are inserted on finish.

Modules: this one (the public API and the pass loop), ``engine_types.py`` (records in and out),
``engine_state.py`` (request and rank state), ``engine_cost.py`` (pass times), ``engine_prefill.py``
(PrefillAdder), ``engine_apply.py`` (applying a pass), ``engine_memory.py`` (aborts, retraction).
"""

from __future__ import annotations

import heapq

from backends.sim.engine_apply import PassApply
from backends.sim.engine_cost import decode_rank_time, decode_shared_time, prefill_parts
from backends.sim.engine_prefill import PrefillAdder
from backends.sim.engine_state import GEN_WINDOW_S, PREFILL, RUNNING, WAITING, RankState, ReqState
from backends.sim.engine_types import (
    STUCK_MESSAGE,
    UNBOUNDED_TOKENS,
    EngineCounters,
    EngineEvent,
    EngineRequest,
    RankLoad,
    default_output_block,
)
from backends.sim.profile_model import Profile
from backends.sim.profiles import PROFILES, get_profile

__all__ = [
    "PROFILES",
    "STUCK_MESSAGE",
    "UNBOUNDED_TOKENS",
    "Engine",
    "EngineCounters",
    "EngineEvent",
    "EngineRequest",
    "Profile",
    "RankLoad",
    "default_output_block",
    "get_profile",
]


class Engine(PassApply, PrefillAdder):
    """One SGLang server: dp_size ranks (1 unless the profile uses DP attention), each with its own KV pool,
    radix cache, waiting queue and running batch; under DP the ranks step together (one pass = max of the
    ranks' pass times, so one rank's prefill chunk delays the others' decode step)."""

    def __init__(self, profile: Profile, *, kv_tokens: int | None = None, unbounded: bool = False) -> None:
        self.profile = profile
        self.dp_size = profile.dp_size
        self.unbounded = unbounded
        self.max_total_num_tokens = UNBOUNDED_TOKENS if unbounded else (kv_tokens or profile.kv_tokens)
        self.counters = EngineCounters()
        p = profile
        self._ratio_init = min(p.init_new_token_ratio, 1.0)
        self._ratio_min = self._ratio_init * p.min_new_token_ratio_factor
        self._ratio_decay = (self._ratio_init - self._ratio_min) / p.new_token_ratio_decay_steps
        host = 0 if unbounded else p.host_tier_tokens
        self._ranks = [
            RankState(i, self.max_total_num_tokens, host, self._ratio_init, self.counters, p.eviction == "lrf")
            for i in range(self.dp_size)
        ]
        self._reqs: dict[str, ReqState] = {}
        self._rr = 0
        self._seq = 0
        self._pass_end: float | None = None
        self._pending: list[EngineEvent] = []  # rejections, emitted at their own time
        self._arrivals: list[tuple[float, int, ReqState]] = []  # (ready time, seq, request): tokenising
        self._delayed = 0  # passes the prefill delayer has held prefills back
        self._delay_since = 0.0

    # ---- public API -------------------------------------------------------------------------
    def submit(self, req: EngineRequest, now: float) -> None:
        if req.rid in self._reqs:
            raise ValueError(f"duplicate live request id {req.rid!r}")
        if req.dp_rank is not None:
            if not 0 <= req.dp_rank < self.dp_size:
                raise ValueError(f"dp_rank {req.dp_rank} out of range 0..{self.dp_size - 1}")
            rank = req.dp_rank
        else:
            rank = self._rr
            self._rr = (self._rr + 1) % self.dp_size
        r = ReqState(req, rank, self._ranks[rank].cache.root)
        limit = min(self.max_total_num_tokens, self.profile.context_length)
        if r.prompt_len + 1 > limit:
            self.counters.aborted += 1
            self._pending.append(
                EngineEvent(
                    "finished",
                    req.rid,
                    now,
                    prompt_tokens=r.prompt_len,
                    finish_reason="abort",
                    rank=rank,
                    message=f"prompt of {r.prompt_len} tokens can never fit (limit {limit - 1})",
                )
            )
            return
        # SGLang clamps max_new_tokens so that input + output fits min(context, pool) (max_req_len).
        r.max_new = min(r.max_new, limit - r.prompt_len - 1)
        r.target = max(1, min(r.target, r.max_new))
        self._reqs[req.rid] = r
        overhead = self.profile.overhead_s(r.prompt_len)
        if overhead > 0:  # TokenizerManager and HTTP first: the scheduler sees it later
            self._seq += 1
            heapq.heappush(self._arrivals, (now + overhead, self._seq, r))
            return
        self._ranks[rank].waiting.append(r)
        if self._pass_end is None:
            self._start_pass(now)

    def next_time(self) -> float | None:
        times = [t for t in (self._pass_end,) if t is not None]
        if self._pending:
            times.append(self._pending[0].time)
        if self._arrivals:
            times.append(self._arrivals[0][0])
        return min(times) if times else None

    def complete(self) -> list[EngineEvent]:
        if self._arrivals and self._arrivals[0][0] <= min(
            t
            for t in (self._pass_end, self._pending[0].time if self._pending else None, self._arrivals[0][0])
            if t is not None
        ):
            now = self._arrivals[0][0]
            while self._arrivals and self._arrivals[0][0] <= now:
                _, _, r = heapq.heappop(self._arrivals)
                if r.state == WAITING and self._reqs.get(r.rid) is r:
                    self._ranks[r.rank].waiting.append(r)
            if self._pass_end is None:
                self._start_pass(now)
            return []
        if self._pending and (self._pass_end is None or self._pending[0].time <= self._pass_end):
            t = self._pending[0].time
            out = [e for e in self._pending if e.time <= t]
            self._pending = [e for e in self._pending if e.time > t]
            return out
        if self._pass_end is None:
            return []
        now = self._pass_end
        events: list[EngineEvent] = []
        for rk in self._ranks:
            if rk.work is not None:
                kind, items, _ = rk.work
                rk.work = None
                if kind == "mixed":  # the running batch's token first, then the chunk's requests join it
                    self._finish_decode(rk, now, events)
                    self._finish_prefill(rk, items, now, events)
                elif kind == "prefill":
                    self._finish_prefill(rk, items, now, events)
                else:
                    self._finish_decode(rk, now, events)
        self._pass_end = None
        self._start_pass(now)
        return events

    def advance(self, until: float) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        while (t := self.next_time()) is not None and t <= until:
            events.extend(self.complete())
        return events

    def generated(self, rid: str) -> int:
        r = self._reqs.get(rid)
        return 0 if r is None else self._ranks[r.rank].gen_of(r)

    def is_live(self, rid: str) -> bool:
        return rid in self._reqs

    def idle(self) -> bool:
        return self._pass_end is None and not self._pending and not self._arrivals

    def loads(self) -> list[RankLoad]:
        out = []
        for rk in self._ranks:
            c = rk.cache
            used = rk.cap - rk.free - c.evictable_tokens
            hit = sum(h for h, _ in rk.hits)
            tot = sum(h + u for h, u in rk.hits)
            span = GEN_WINDOW_S
            out.append(
                RankLoad(
                    dp_rank=rk.idx,
                    num_running_reqs=len(rk.running) + sum(1 for r in self._prefilling(rk)),
                    num_waiting_reqs=len(rk.waiting),
                    num_used_tokens=used,
                    max_total_num_tokens=rk.cap,
                    token_usage=used / rk.cap,
                    cache_hit_rate=hit / tot if tot else 0.0,
                    gen_throughput=rk.gen_window_sum / span,
                    max_running_requests=self.profile.max_running_requests,
                    extra={
                        "cached_tokens": float(c.evictable_tokens),
                        "host_tokens": float(c.host_tokens),
                        "new_token_ratio": rk.ratio,
                        "sum_context_tokens": float(rk.ctx_sum),
                    },
                )
            )
        return out

    def flush_cache(self) -> bool:
        if self._reqs or self._pass_end is not None:
            return False
        for rk in self._ranks:
            rk.cache.reset()
            rk.hits.clear()
            rk.blocked = None
        return True

    def check_invariants(self) -> None:
        for rk in self._ranks:
            c = rk.cache
            c.check()
            live = [r for r in self._reqs.values() if r.rank == rk.idx and r.state in (PREFILL, RUNNING)]
            assert rk.private == sum(rk.private_of(r) for r in live), "private KV accounting drifted"
            assert all(rk.private_of(r) >= 0 for r in live)
            assert 0 <= rk.free <= rk.cap, (rk.free, rk.cap)
            assert c.gpu_tokens + rk.private <= rk.cap
            assert rk.ctx_sum == sum(r.prompt_len + rk.gen_of(r) for r in rk.running.values())
            expected: dict[int, int] = {}
            for r in live:
                n = r.node
                while n is not c.root:
                    expected[id(n)] = expected.get(id(n), 0) + 1
                    n = n.parent  # type: ignore[assignment]
            for n in c.nodes.values():
                assert n.lock_ref == expected.get(id(n), 0), "lock_ref differs from the live requests' paths"
            for r in live:
                assert r.tree_len == (r.ends[r.nblk - 1] if r.nblk else 0)
                assert r.cached <= r.prompt_len
            if not live:
                assert rk.private == 0 and c.gpu_tokens == c.evictable_tokens, "leaked KV"

    # ---- pass scheduling ----------------------------------------------------------------
    def _prefilling(self, rk: RankState) -> list[ReqState]:
        return [r for r in self._reqs.values() if r.rank == rk.idx and r.state == PREFILL]

    def _start_pass(self, now: float) -> None:
        p = self.profile
        times: list[float] = []
        decoding = 0
        delay = self._delay_prefill(now)
        parts: dict[int, tuple[float, float]] = {}
        for rk in self._ranks:
            items = [] if delay else self._form_prefill(rk)
            while not delay and not items and rk.waiting and not rk.running and rk.chunked is None:
                # Nothing holds KV on this rank but the head's own prefix, so nothing will ever
                # free room for it: abort it rather than go idle with it queued. Unreachable
                # while admission and submit() agree (submit clamps every request to the pool).
                self._abort_with_event(rk, self._policy_order(rk)[0], now, STUCK_MESSAGE)
                items = self._form_prefill(rk)
            if items:
                parts[rk.idx] = prefill_parts(p, items)
                mixed = p.mixed_chunk and bool(rk.running) and (rk.free + rk.cache.evictable_tokens >= len(rk.running))
                rk.work = ("mixed" if mixed else "prefill", items, 0.0)
                if mixed:
                    decoding += len(rk.running)
            elif rk.running:
                self._maybe_retract(rk, now)
                if rk.running:
                    rk.work = ("decode", [], 0.0)
                    decoding += len(rk.running)
            if rk.work is None and not rk.waiting and rk.chunked is None:
                rk.ratio = self._ratio_init  # idle: SGLang resets the ratio
        if parts:
            cp = max(1, p.prefill_cp_size)
            group_attn: dict[int, float] = {}
            for idx, (_, attn) in parts.items():
                # A context-parallel group's GPUs are shared: its ranks' attention runs one after another.
                group_attn[idx // cp] = group_attn.get(idx // cp, 0.0) + attn
            for idx, (base, attn) in parts.items():
                t = base + (group_attn[idx // cp] if cp > 1 else attn)
                rk = self._ranks[idx]
                assert rk.work is not None
                kind, items, _ = rk.work
                if kind == "mixed":  # the decodes ride along: their per-request and KV-read cost
                    t += decode_rank_time(p, rk, 0.0)
                rk.work = (kind, items, t)
                times.append(t)
        if decoding:
            shared = decode_shared_time(p, decoding)
            for rk in self._ranks:
                if rk.work is not None and rk.work[0] == "decode":
                    t = decode_rank_time(p, rk, shared)
                    rk.work = ("decode", [], t)
                    times.append(t)
        if times:
            self._pass_end = now + max(times)

    def _delay_prefill(self, now: float) -> bool:
        """SGLang's PrefillDelayer (``managers/prefill_delayer.py``, opt-in under DP attention): when
        some ranks could prefill and others could not, hold every rank's prefill for up to
        ``max_delay_passes`` passes (or ``max_delay_ms``) so that the ranks' prefills share passes
        instead of each holding the others' decode back."""
        p = self.profile
        if p.prefill_delayer_max_passes <= 0 or self.dp_size == 1:
            return False
        able = [bool(rk.waiting) or rk.chunked is not None for rk in self._ranks]
        if any(able) and not all(able) and any(rk.running for rk in self._ranks):
            if self._delayed == 0:
                self._delay_since = now
            if self._delayed < p.prefill_delayer_max_passes and now - self._delay_since < p.prefill_delayer_max_delay_s:
                self._delayed += 1
                return True
        self._delayed = 0
        return False
