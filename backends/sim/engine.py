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
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Literal

from backends.sim.profiles import PROFILES, Profile, get_profile
from backends.sim.radix import Node, RadixCache
from backends.sim.tokenizer import Block, chain_key

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

UNBOUNDED_TOKENS = 10**12
"""``max_total_num_tokens`` of an ``unbounded`` engine: a pool that never evicts."""

STUCK_MESSAGE = "request cannot be admitted even into an empty batch"
"""Message of the abort that keeps a rank from idling with a request it can never admit."""


def default_output_block(prompt: list[Block], rid: str, ntok: int) -> Block:
    """The block a finished request with ``final_blocks=None`` inserts for its output.

    It holds ``output_tokens - 1`` tokens (the last output token has no KV). A caller that builds
    the next turn's prompt as ``prompt + [this block] + new blocks`` keeps the whole history
    matchable.
    """
    last = prompt[-1][0] if prompt else 0
    return (chain_key(last, b"output:" + rid.encode()), ntok)


@dataclass(slots=True)
class EngineRequest:
    rid: str
    prompt: list[Block]
    """Prompt blocks with chained keys; their token counts sum to the prompt length."""
    output_tokens: int
    """Tokens this request will generate before it finishes (the twin decides from max_tokens)."""
    max_new_tokens: int
    """What admission reserves for (SGLang clips the estimate at 4096)."""
    final_blocks: list[Block] | None = None
    """Blocks of prompt + output, inserted into the cache when the request finishes. None: the
    prompt blocks plus one block unique to this rid for the output."""
    dp_rank: int | None = None
    """Pinned DP rank (``routed_dp_rank``); None: the server's own round-robin."""

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.prompt)


@dataclass(frozen=True, slots=True)
class EngineEvent:
    kind: Literal["first_token", "finished"]
    rid: str
    time: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens served from the cache at the (last) admission of this request."""
    finish_reason: Literal["length", "stop", "abort"] | None = None
    retractions: int = 0
    rank: int = 0
    message: str = ""


@dataclass(slots=True)
class EngineCounters:
    """Monotone totals, as SGLang's ``sglang:*_total`` counters."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    prefill_compute_tokens: int = 0
    prefill_cache_tokens: int = 0
    host_load_tokens: int = 0
    retractions: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    evicted_tokens: int = 0


@dataclass(slots=True)
class RankLoad:
    """One rank's point-in-time state, as ``/v1/loads`` reports it."""

    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_used_tokens: int
    max_total_num_tokens: int
    token_usage: float
    cache_hit_rate: float
    gen_throughput: float
    max_running_requests: int
    extra: dict[str, float] = field(default_factory=dict)


_WAITING, _PREFILL, _RUNNING, _DONE = 0, 1, 2, 3
_HIT_WINDOW = 32  # prefill batches behind cache_hit_rate
_GEN_WINDOW_S = 10.0  # engine seconds behind gen_throughput


class _Req:
    """Engine-side state of one request (KV held = tree path + private tokens)."""

    __slots__ = (
        "blocks",
        "cached",
        "ends",
        "ereq",
        "fill_len",
        "fin_step",
        "first_done",
        "gen",
        "kv",
        "m_epoch",
        "m_gpu",
        "m_host",
        "max_new",
        "nblk",
        "node",
        "pending",
        "prompt_len",
        "rank",
        "retractions",
        "rid",
        "state",
        "step_base",
        "target",
        "tree_len",
    )

    def __init__(self, ereq: EngineRequest, rank: int, root: Node) -> None:
        self.ereq = ereq
        self.rid = ereq.rid
        self.rank = rank
        self.blocks = ereq.prompt
        self.ends = list(accumulate(n for _, n in ereq.prompt))
        self.prompt_len = self.ends[-1] if self.ends else 0
        self.target = max(1, ereq.output_tokens)
        self.max_new = ereq.max_new_tokens
        self.state = _WAITING
        self.gen = 0  # output tokens so far (while running: at step_base)
        self.step_base = 0
        self.fill_len = self.prompt_len
        self.kv = 0  # tokens computed (prefill progress), while not running
        self.pending = 0  # tokens allocated for the chunk in flight
        self.node = root  # deepest locked node
        self.tree_len = 0  # tokens covered by the locked path
        self.nblk = 0  # prompt blocks covered by the locked path
        self.cached = 0
        self.first_done = False
        self.retractions = 0
        self.fin_step = 0
        self.m_epoch = -1
        self.m_gpu = 0
        self.m_host = 0


class _Rank:
    def __init__(self, idx: int, cap: int, host_capacity: int, ratio: float, counters: EngineCounters) -> None:
        self.idx = idx
        self.counters = counters
        self.cap = cap
        self.cache = RadixCache(host_capacity)
        self.waiting: list[_Req] = []
        self.running: dict[str, _Req] = {}
        self.chunked: _Req | None = None
        self.private = 0  # KV tokens held by requests outside the tree
        self.ctx_sum = 0  # Σ (prompt + generated) over running requests
        self.steps = 0  # decode steps completed
        self.fin_heap: list[tuple[int, int, _Req]] = []
        self.ratio = ratio
        self.work: tuple[str, list[tuple[_Req, int, int]], float] | None = None
        self.hits: deque[tuple[int, int]] = deque(maxlen=_HIT_WINDOW)
        self.gen_window: deque[tuple[float, int]] = deque()
        self.gen_window_sum = 0
        self.blocked: tuple[_Req, int, int, int] | None = None  # (head, epoch, need, path evictable)

    @property
    def free(self) -> int:
        return self.cap - self.cache.gpu_tokens - self.private

    def ensure_free(self, n: int) -> bool:
        short = n - self.free
        if short > 0:
            self.counters.evicted_tokens += self.cache.evict(short)
        return self.free >= n

    def gen_of(self, r: _Req) -> int:
        return r.gen + (self.steps - r.step_base) if r.state == _RUNNING else r.gen

    def private_of(self, r: _Req) -> int:
        if r.state == _RUNNING:
            return r.prompt_len + self.gen_of(r) - 1 - r.tree_len
        return r.kv + r.pending - r.tree_len


class Engine:
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
            _Rank(i, self.max_total_num_tokens, host, self._ratio_init, self.counters) for i in range(self.dp_size)
        ]
        self._reqs: dict[str, _Req] = {}
        self._rr = 0
        self._seq = 0
        self._pass_end: float | None = None
        self._pending: list[EngineEvent] = []  # rejections, emitted at their own time
        self._arrivals: list[tuple[float, int, _Req]] = []  # (ready time, seq, request): tokenising
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
        r = _Req(req, rank, self._ranks[rank].cache.root)
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

    def abort(self, rid: str, now: float) -> bool:
        r = self._reqs.pop(rid, None)
        if r is None:
            return False
        rk = self._ranks[r.rank]
        if r.state == _WAITING:
            if r in rk.waiting:
                rk.waiting.remove(r)
            # else still being tokenised: its arrival entry is skipped (state _DONE below)
        else:
            self._release(rk, r)
            if r.state == _RUNNING:
                del rk.running[rid]
                rk.ctx_sum -= r.prompt_len + rk.gen_of(r)
            if rk.chunked is r:
                rk.chunked = None
        r.state = _DONE
        self.counters.aborted += 1
        return True

    def next_time(self) -> float | None:
        times = [t for t in (self._pass_end,) if t is not None]
        if self._pending:
            times.append(self._pending[0].time)
        if self._arrivals:
            times.append(self._arrivals[0][0])
        return min(times) if times else None

    def complete(self) -> list[EngineEvent]:
        if self._arrivals and self._arrivals[0][0] <= min(
            t for t in (self._pass_end, self._pending[0].time if self._pending else None, self._arrivals[0][0])
            if t is not None
        ):
            now = self._arrivals[0][0]
            while self._arrivals and self._arrivals[0][0] <= now:
                _, _, r = heapq.heappop(self._arrivals)
                if r.state == _WAITING and self._reqs.get(r.rid) is r:
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
            span = _GEN_WINDOW_S
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
            live = [r for r in self._reqs.values() if r.rank == rk.idx and r.state in (_PREFILL, _RUNNING)]
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
    def _prefilling(self, rk: _Rank) -> list[_Req]:
        return [r for r in self._reqs.values() if r.rank == rk.idx and r.state == _PREFILL]

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
                parts[rk.idx] = self._prefill_parts(items)
                mixed = p.mixed_chunk and bool(rk.running) and (
                    rk.free + rk.cache.evictable_tokens >= len(rk.running))
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
                    t += self._decode_rank_time(rk, 0.0)
                rk.work = (kind, items, t)
                times.append(t)
        if decoding:
            shared = self._decode_shared_time(decoding)
            for rk in self._ranks:
                if rk.work is not None and rk.work[0] == "decode":
                    t = self._decode_rank_time(rk, shared)
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

    def _decode_shared_time(self, decoding: int) -> float:
        """The part of a decode step every rank pays: fixed overhead and the routed-expert stream.

        Coverage counts the tokens a pipeline stage sees per micro-batch: B/pp once there are at
        least pp requests, else one request at a time through every stage. With speculative
        decoding a verify step carries d + 1 tokens per request and the draft passes add d × the
        draft overhead × ``a``."""
        p = self.profile
        q = 1 + p.spec_draft_tokens
        per_stage = max(decoding / p.pp, 1.0) * q
        cov = 1.0 - (1.0 - p.experts_per_token / p.num_experts) ** per_stage
        return p.a * (1.0 + p.spec_draft_overhead * p.spec_draft_tokens) + p.t_experts * cov

    def _decode_rank_time(self, rk: _Rank, shared: float) -> float:
        """One rank's decode step: ``shared`` plus its requests' linear compute and KV reads, per
        output token (a verify step yields ``spec_accept_length`` tokens per request)."""
        p = self.profile
        b = len(rk.running)
        q = 1 + p.spec_draft_tokens
        kv = p.k_kv * rk.ctx_sum * p.pp / min(b, p.pp) * (p.spec_kv_factor if p.spec_draft_tokens else 1.0)
        t = shared + p.b * min(b * q, p.b_cap) + kv
        return t / p.spec_accept_length

    def _prefill_time(self, items: list[tuple[_Req, int, int]]) -> float:
        base, attn = self._prefill_parts(items)
        return base + attn

    def _prefill_parts(self, items: list[tuple[_Req, int, int]]) -> tuple[float, float]:
        """(linear + fixed + host-load time, attention time) of one rank's prefill batch. The
        attention part includes the per-chunk ``kv_b_proj`` re-expansion of each item's prefix."""
        p = self.profile
        u_sum = 0
        attn = 0.0
        prefix = 0
        host = 0
        for _, u, c in items:
            if u < 0:  # host-tier load marker
                host += -u
                continue
            u_sum += u
            attn += u * (c + u / 2)
            prefix += c
        base = (p.t0 + u_sum / p.r_lin) / p.prefill_efficiency
        if host:
            base += host / p.host_load_tokens_per_s
        return base, (p.k_attn * attn + p.k_kvb * prefix) / p.prefill_efficiency

    def _offset(self, rk: _Rank) -> float:
        clip = self.profile.clip_max_new_tokens
        steps = rk.steps
        total = 0
        for r in rk.running.values():
            left = r.max_new - (r.gen + steps - r.step_base)
            total += left if left < clip else clip
        return total * rk.ratio

    def _match(self, rk: _Rank, r: _Req) -> tuple[int, int]:
        if r.m_epoch != rk.cache.epoch:
            r.m_gpu, r.m_host = rk.cache.match(r.blocks)
            r.m_epoch = rk.cache.epoch
        return r.m_gpu, r.m_host

    def _prefix_tokens(self, rk: _Rank, r: _Req) -> int:
        g, h = self._match(rk, r)
        return r.ends[g + h - 1] if g + h else 0

    def _policy_order(self, rk: _Rank) -> list[_Req]:
        """The waiting queue in admission order: FCFS, or LPM (stable) below 129 waiting."""
        if self.profile.schedule_policy == "lpm" and len(rk.waiting) <= 128:
            return sorted(rk.waiting, key=lambda q: -self._prefix_tokens(rk, q))
        return rk.waiting

    def _form_prefill(self, rk: _Rank) -> list[tuple[_Req, int, int]]:
        """PrefillAdder: the chunked request first, then the waiting queue in policy order."""
        if not rk.waiting and rk.chunked is None:
            return []
        p = self.profile
        page = p.page_size
        cache = rk.cache
        rem_input = p.max_prefill_tokens
        rem_chunk = p.chunked_prefill_size
        items: list[tuple[_Req, int, int]] = []
        offset = None
        if rk.chunked is not None:
            r = rk.chunked
            offset = self._offset(rk)
            room = min(rem_chunk, int(rk.free + cache.evictable_tokens - offset))
            chunk = min(r.fill_len - r.kv, room if room > 0 else rem_chunk)
            if not rk.ensure_free(chunk):
                chunk = rk.free
            if chunk <= 0:
                self._retract(rk, r)  # cannot make progress: give its KV back, recompute later
            else:
                r.pending = chunk
                rk.private += chunk
                items.append((r, chunk, r.kv))
                rem_input -= chunk
                rem_chunk -= chunk
                offset += page  # the chunk itself is allocated already (free went down)
                self.counters.prefill_compute_tokens += chunk
        if not rk.waiting or rem_chunk <= 0 or rem_input <= 0:
            return items
        if len(rk.running) + len(items) >= p.max_running_requests:
            return items
        order = self._policy_order(rk)
        admitted = False
        hit_tokens = 0
        in_tokens = 0
        clip = p.clip_max_new_tokens
        for r in order:
            if len(rk.running) + len(items) >= p.max_running_requests:
                break
            if offset is None:
                offset = self._offset(rk)
            g, h = self._match(rk, r)
            gpu_len = r.ends[g - 1] if g else 0
            host_len = (r.ends[g + h - 1] - gpu_len) if h else 0
            extend = r.fill_len - gpu_len - host_len
            max_new = min(max(r.max_new - r.gen, 0), clip)
            need = extend + max_new + page + host_len
            memo = rk.blocked
            if (
                memo is not None
                and memo[0] is r
                and memo[1] == cache.epoch
                and (rk.running or items)
                and memo[2] >= rk.free + cache.evictable_tokens - memo[3] - offset
            ):
                break  # still NO_TOKEN: neither the match nor the head's locked share has moved
            node = cache.nodes[r.blocks[g - 1][0]] if g else cache.root
            before = cache.evictable_tokens
            cache.lock(node)
            path_evictable = before - cache.evictable_tokens
            room = rk.free + cache.evictable_tokens - offset
            if need >= room and not (not rk.running and not items and extend + 1 <= room):
                cache.unlock(node)
                rk.blocked = (r, cache.epoch, need, path_evictable)
                break  # NO_TOKEN: FCFS does not skip the head
            prefix = gpu_len + host_len
            chunk = extend
            if -(-extend // page) * page > rem_chunk:
                end = (prefix + rem_chunk // page * page) // page * page
                chunk = end - prefix
                if chunk <= 0:
                    cache.unlock(node)
                    break
                max_new = 0
            rk.blocked = None
            # Admit: the GPU prefix is locked; bring the host part back, then allocate the chunk.
            if h:
                for k in range(g, g + h):
                    cache.load_back(cache.nodes[r.blocks[k][0]])
                deeper = cache.nodes[r.blocks[g + h - 1][0]]
                cache.lock(deeper)
                cache.unlock(node)
                node = deeper
                rk.ensure_free(0)
                self.counters.host_load_tokens += host_len
                items.append((r, -host_len, 0))
            cache.touch_path(node)
            ok = rk.ensure_free(chunk)
            assert ok, "admission promised room it does not have"
            r.node = node
            r.nblk = g + h
            r.tree_len = prefix
            r.kv = prefix
            r.pending = chunk
            r.cached = min(prefix, r.prompt_len)
            r.state = _PREFILL
            rk.private += chunk
            items.append((r, chunk, prefix))
            admitted = True
            hit_tokens += prefix
            in_tokens += chunk
            self.counters.prefill_cache_tokens += prefix
            self.counters.prefill_compute_tokens += chunk
            offset += page + max_new  # the chunk is allocated already
            rem_input -= chunk
            rem_chunk -= chunk
            if chunk < extend:
                rk.chunked = r
                break
            if rem_chunk <= 0 or rem_input <= 0:
                break
        if admitted:
            rk.waiting = [q for q in rk.waiting if q.state == _WAITING]
            rk.hits.append((hit_tokens, in_tokens))
        return items

    # ---- applying a pass ------------------------------------------------------------------
    def _finish_prefill(self, rk: _Rank, items: list[tuple[_Req, int, int]], now: float, ev: list[EngineEvent]) -> None:
        for r, chunk, _ in items:
            if chunk < 0 or r.state != _PREFILL:
                continue  # host-load marker, or aborted during the pass
            r.kv += chunk
            r.pending = 0
            self._insert_computed(rk, r)
            if r.kv < r.fill_len:
                rk.chunked = r
                continue
            if rk.chunked is r:
                rk.chunked = None
            r.gen += 1
            if not r.first_done:
                r.first_done = True
                ev.append(
                    EngineEvent(
                        "first_token",
                        r.rid,
                        now,
                        prompt_tokens=r.prompt_len,
                        cached_tokens=r.cached,
                        retractions=r.retractions,
                        rank=rk.idx,
                    )
                )
            self._note_gen(rk, now, 1)
            r.state = _RUNNING
            r.step_base = rk.steps
            rk.running[r.rid] = r
            rk.ctx_sum += r.prompt_len + r.gen
            if r.gen >= r.target:
                self._finish(rk, r, now, ev)
            else:
                r.fin_step = rk.steps + (r.target - r.gen)
                self._seq += 1
                heapq.heappush(rk.fin_heap, (r.fin_step, self._seq, r))

    def _insert_computed(self, rk: _Rank, r: _Req) -> None:
        """Insert the whole prompt blocks computed so far and move the lock to the new path end."""
        cache = rk.cache
        node = r.node
        ends = r.ends
        blocks = r.blocks
        n = len(blocks)
        i = r.nblk
        start = i
        while i < n and ends[i] <= r.kv:
            key, ntok = blocks[i]
            if cache.conflicts(node, key, ntok):
                break  # the key names another prefix (malformed blocks): the rest stays private
            node, _ = cache.put(node, key, ntok)
            rk.private -= ntok  # moved into the tree, or a duplicate freed
            i += 1
        if i != start:
            cache.lock(node)
            cache.unlock(r.node)
            r.node = node
            r.nblk = i
            r.tree_len = ends[i - 1]

    def _finish_decode(self, rk: _Rank, now: float, ev: list[EngineEvent]) -> None:
        b = len(rk.running)
        ok = rk.ensure_free(b)
        assert ok, "decode step started without room"
        rk.private += b
        rk.ctx_sum += b
        rk.steps += 1
        self._note_gen(rk, now, b)
        heap = rk.fin_heap
        while heap and heap[0][0] <= rk.steps:
            fin, _, r = heapq.heappop(heap)
            if r.state == _RUNNING and r.fin_step == fin and rk.running.get(r.rid) is r:
                self._finish(rk, r, now, ev)

    def _note_gen(self, rk: _Rank, now: float, n: int) -> None:
        w = rk.gen_window
        w.append((now, n))
        rk.gen_window_sum += n
        while w and w[0][0] < now - _GEN_WINDOW_S:
            rk.gen_window_sum -= w.popleft()[1]

    def _finish(self, rk: _Rank, r: _Req, now: float, ev: list[EngineEvent]) -> None:
        cache = rk.cache
        gen = rk.gen_of(r)
        kv = r.prompt_len + gen - 1  # the last token has no KV yet
        private = kv - r.tree_len
        final = r.ereq.final_blocks
        if final is None:
            out = kv - r.prompt_len
            final = list(r.blocks)
            if out > 0:
                final.append(default_output_block(r.blocks, r.rid, out))
        budget = private
        node = cache.root
        pos = 0
        for key, ntok in final:
            if pos + ntok > kv:
                break
            if cache.conflicts(node, key, ntok):
                break  # the key names another prefix (malformed blocks)
            existing = cache.nodes.get(key)
            if existing is not None and existing.on_gpu:
                node = existing
            elif ntok <= budget:
                node, _ = cache.put(node, key, ntok)
                budget -= ntok
            else:
                break
            pos += ntok
        cache.touch_path(node)
        cache.unlock(r.node)
        rk.private -= private
        del rk.running[r.rid]
        rk.ctx_sum -= r.prompt_len + gen
        r.gen = gen
        r.state = _DONE
        r.node = cache.root
        del self._reqs[r.rid]
        c = self.counters
        c.requests += 1
        c.prompt_tokens += r.prompt_len
        c.generation_tokens += gen
        c.cached_tokens += r.cached
        ev.append(
            EngineEvent(
                "finished",
                r.rid,
                now,
                prompt_tokens=r.prompt_len,
                completion_tokens=gen,
                cached_tokens=r.cached,
                finish_reason="length" if gen >= r.max_new or gen < r.ereq.output_tokens else "stop",
                retractions=r.retractions,
                rank=rk.idx,
            )
        )

    # ---- memory pressure ------------------------------------------------------------------
    def _abort_with_event(self, rk: _Rank, r: _Req, now: float, message: str) -> None:
        """Abort a live request on the engine's own decision and report it as finished (abort)."""
        gen = rk.gen_of(r)
        self.abort(r.rid, now)
        self._pending.append(
            EngineEvent(
                "finished",
                r.rid,
                now,
                prompt_tokens=r.prompt_len,
                completion_tokens=gen,
                cached_tokens=r.cached,
                finish_reason="abort",
                retractions=r.retractions,
                rank=rk.idx,
                message=message,
            )
        )

    def _release(self, rk: _Rank, r: _Req) -> None:
        """Free a request's private KV and unlock its path (the computed prefix stays cached)."""
        rk.private -= rk.private_of(r)
        rk.cache.unlock(r.node)
        r.node = rk.cache.root
        r.nblk = 0
        r.tree_len = 0
        r.kv = 0
        r.pending = 0

    def _retract(self, rk: _Rank, r: _Req) -> None:
        gen = rk.gen_of(r)
        self._release(rk, r)
        if r.state == _RUNNING:
            del rk.running[r.rid]
            rk.ctx_sum -= r.prompt_len + gen
        if rk.chunked is r:
            rk.chunked = None
        r.gen = gen
        r.fill_len = r.prompt_len + gen  # SGLang re-prefills input + output so far
        r.state = _WAITING
        r.retractions += 1
        rk.waiting.append(r)  # 0.5.23 `_add_request_to_queue`: appended; FCFS does not re-sort
        c = self.counters
        c.retractions += 1
        c.retracted_input_tokens += r.prompt_len
        c.retracted_output_tokens += gen

    def _maybe_retract(self, rk: _Rank, now: float) -> None:
        """check_decode_mem / retract_decode: one token per running request must fit."""
        cache = rk.cache
        if rk.free + cache.evictable_tokens >= len(rk.running):
            rk.ratio = max(rk.ratio - self._ratio_decay, self._ratio_min)
            return
        order = sorted(rk.running.values(), key=lambda q: (rk.gen_of(q), -q.prompt_len))
        first = True
        while first or rk.free + cache.evictable_tokens < len(rk.running):
            if len(rk.running) == 1:
                break
            first = False
            self._retract(rk, order.pop(0))
        if rk.free + cache.evictable_tokens < len(rk.running):
            last = next(iter(rk.running.values()))
            self._abort_with_event(
                rk, last, now, "Out of memory even after retracting all other requests in the decode batch."
            )
        running = list(rk.running.values())
        decoded = sum(rk.gen_of(q) for q in running)
        max_new = sum(q.max_new for q in running)
        rk.ratio = min(1.0, (decoded + self.profile.retract_decode_steps * len(running)) / (max_new + 1))
