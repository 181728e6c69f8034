"""``min-ttft``: cachegate's router. Each request goes where its first token is expected soonest."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.prefix_index import PrefixIndex, cumulative_tokens
from policies.routers.base import Rendezvous, make_dispatch, slot_label, slots_of, stable_hash
from policies.routers.estimators import CommonBlocks as CommonBlocks
from policies.routers.estimators import Footprint, RecentMax, SlotState
from policies.routers.estimators import PrefillModel as PrefillModel
from policies.routing import Router, RouterHook
from policies.types import BackendView, Dispatch, Fingerprint, Outcome, RequestFacts, Slot


@dataclass(slots=True)
class _Entry:
    slot: Slot
    fp: Fingerprint
    prompt: int
    cached: int
    prefill_s: float
    wait_s: float
    dispatched_at: float
    state: SlotState
    """``MinTTFT._slots[slot]`` (never removed), so that the events after dispatch need no lookup."""
    ttft: float | None = None


class MinTTFT(Router):
    """Minimum expected time to first token, with a load gate and replica-stable cold placement.

    For each candidate slot s (a backend, or one DP rank of it) and a request of P prompt tokens:

    - ``c_s`` = tokens of the request's prefix the slot probably holds (``PrefixIndex``: prompts
      dispatched there, LRU-bounded by the rank's ``kv_tokens``);
    - ``wait_s`` = the prefill work this router queued there that has not produced a first token
      (each dispatch adds its predicted prefill after what is already queued) plus, when the backend
      reports more waiting requests than this router has pending there (other replicas, other
      clients), that surplus × the recent mean prefill, split over its ranks (a report may be up to
      ``report_lag_s`` old: it is compared with the most this router had pending there meanwhile);
      plus, with ``n_s`` ≥ the rank's ``max_running_requests`` C, ``(n_s + 1 − C) × mean decode / C``
      (the wait for a running slot; mean decode: EWMA of first token to finish, measured);
    - ``prefill_s = PrefillModel(P − c_s, c_s) / speed_b``, ``speed_b`` learned per backend as an
      EWMA (``learn_alpha``) of predicted/observed prefill time over requests that found nothing
      queued ahead (observed = TTFT; predicted from the cached tokens the engine reported);
    - ``ttft_s = wait_s + prefill_s``.

    The gate (a safety net against hot spots, not a balancer), with ``n_s`` the requests in flight on
    s (this router's, plus any surplus the backend reports, split over ranks: so replicas see one
    another's load at the next poll) and ``m = (Σ n + 1) / S``, allows s iff
    ``n_s + 1 ≤ max(r × m, m + gate_slack)`` (all, if none is), where
    ``r = min(gate_max, gate_ratio × (1 + lost_s / gate_move_s))`` and ``lost_s = max_s prefill_s −
    min_s prefill_s``: only a request that loses nothing by moving is balanced at 1.5× the mean.

    Warm requests (some slot holds more of the prompt than its common prefix, see below): score
    ``ttft_s + stay × (prefill_s − min_s prefill_s)`` (leaving the cache costs the recompute now and
    a second copy that evicts something else: a move must save ``stay`` times what it adds).
    The near ties are the allowed slots within ``max(tie_abs_s, tie_rel × best)`` of the best score;
    among them keep those holding the longest match (a tie must not cost the cache the next turn
    needs) and pick one at random (seeded). Reason ``prefix`` when the pick holds the longest match
    of all candidates, ``imbalance`` when the gate removed the slot with the best ``ttft_s``, else
    ``least_wait``.

    Cold requests (a new conversation: nobody holds more than the common prefix, i.e. the blocks
    up to the request's deepest ``CommonBlocks`` block: a system prompt, tools, which say nothing
    about the conversation and must not pull every new one to the slot that has them): the pool is
    the allowed slots with ``wait_s`` within ``max(tie_abs_s, tie_rel × least)`` of the least (the
    queue, not the TTFT: a common prefix is cheap to cache where it is not yet), only while the
    backends report at most ``solo_share`` × this router's in-flight count more (else other replicas
    see other queues: all allowed slots). Order the pool by rendezvous hashing of the request's first
    distinguishing block (equal for every turn of a conversation and in every replica) and take the
    first whose recent working set (``Footprint``, tokens) plus this prompt stays under
    ``load_factor × (Σ footprint + P) / S + P`` (bounded-load rendezvous; the least loaded pool slot
    always fits); reason ``cold_hash``. The working set changes slowly, so replicas agree.

    Parameters and defaults (chosen on the tuning part of the routing family,
    ``loadtest/workloads/``; docs/benchmarks.md "Routing across a workload family"): ``model``
    ``PrefillModel()``, ``tie_rel`` 0.1, ``tie_abs_s`` 0.1, ``stay`` 10, ``gate_ratio`` 1.5,
    ``gate_slack`` 8 requests, ``gate_move_s`` 0.1, ``gate_max`` 3, ``solo_share`` 0.25,
    ``load_factor`` 1.5, ``learn_alpha`` 0.1, ``min_learn_s`` 0.05 (shorter predicted prefills are
    too noisy to learn from), ``speed`` in [0.1, 10], ``default_capacity`` 1M tokens per rank until
    a backend reports its own, ``common`` ``CommonBlocks()``, ``active_s`` 600 (the ``Footprint``
    horizon: on the Mooncake trace, 600 s beat 120 s and 300 s on both hit rate and balance),
    ``report_lag_s`` 2 (the pool polls loads about every second), ``seed`` 0 (near-tie RNG).

    ``Dispatch.scores``: ``prompt_tokens``, ``common_tokens``, ``matched_tokens`` and
    ``expected_ttft_s`` / ``wait_s`` of the pick, ``best_match_tokens``, ``candidates``, and
    ``ttft_s:<backend>@<rank>`` for the (up to) eight best candidates.
    """

    name = "min-ttft"
    hooks: ClassVar[frozenset[RouterHook]] = frozenset(
        {"dispatched", "first_token", "finished", "matched_tokens", "swap_index"}
    )

    def __init__(
        self,
        *,
        model: PrefillModel | None = None,
        tie_rel: float = 0.1,
        tie_abs_s: float = 0.1,
        gate_ratio: float = 1.5,
        gate_slack: float = 8.0,
        load_factor: float = 1.5,
        learn_alpha: float = 0.1,
        min_learn_s: float = 0.05,
        default_capacity: int = 1_000_000,
        common: CommonBlocks | None = None,
        active_s: float = 600.0,
        report_lag_s: float = 2.0,
        gate_move_s: float = 0.1,
        gate_max: float = 3.0,
        stay: float = 10.0,
        solo_share: float = 0.25,
        seed: int = 0,
    ) -> None:
        self.stay = stay
        self.solo_share = solo_share
        self.gate_max = gate_max
        self.model = model or PrefillModel()
        self.tie_rel = tie_rel
        self.tie_abs_s = tie_abs_s
        self.gate_ratio = gate_ratio
        self.gate_slack = gate_slack
        self.load_factor = load_factor
        self.learn_alpha = learn_alpha
        self.min_learn_s = min_learn_s
        self.report_lag_s = report_lag_s
        self.gate_move_s = gate_move_s
        self.index = PrefixIndex(default_capacity)
        self.common = common or CommonBlocks()
        self.speed: dict[str, float] = {}
        self._rng = random.Random(seed)
        self._rendezvous = Rendezvous()
        self._slots: dict[Slot, SlotState] = {}
        self._entries: dict[str, _Entry] = {}
        self._inflight_recent: dict[str, RecentMax] = {}
        self._pending_recent: dict[str, RecentMax] = {}
        self._mean_prefill_s = self.model.seconds(8_000, 0)
        self._mean_decode_s = 10.0
        self.footprint = Footprint(active_s)
        self._cum_of: tuple[Fingerprint, list[int]] = ((), [0])
        """The last fingerprint's ``cumulative_tokens``: admission's ``matched_tokens``, ``route`` and
        ``dispatched`` ask for the same request's one after another."""

    def _state(self, slot: Slot) -> SlotState:
        st = self._slots.get(slot)
        if st is None:
            backend = slot[0]
            st = self._slots[slot] = SlotState(
                self._recent(self._pending_recent, backend), self._recent(self._inflight_recent, backend)
            )
        return st

    def _cum(self, fp: Fingerprint) -> list[int]:
        last, cum = self._cum_of
        if fp is not last:  # identity: the same tuple object, so the same blocks
            cum = cumulative_tokens(fp)
            self._cum_of = (fp, cum)
        return cum

    def _prefill(self, backend: str, prompt: int, cached: int) -> float:
        return self.model.seconds(prompt - cached, cached) / self.speed.get(backend, 1.0)

    def _recent(self, table: dict[str, RecentMax], backend: str) -> RecentMax:
        r = table.get(backend)
        if r is None:
            r = table[backend] = RecentMax(self.report_lag_s)
        return r

    def _surplus(self, view: BackendView, now: float) -> tuple[float, float]:
        """(requests, seconds of waiting prefill) the backend reports beyond ours, per rank. The
        report may be up to ``report_lag_s`` old, so it is compared with the most this router had
        there over that time (requests that just finished must not count as someone else's)."""
        ranks = max(1, view.dp_size)
        mine = self._recent(self._inflight_recent, view.name).max(now)
        pending = self._recent(self._pending_recent, view.name).max(now)
        extra_n = max(0, view.running + view.waiting - mine) / ranks
        extra_wait = max(0, view.waiting - pending) / ranks
        return extra_n, extra_wait * self._mean_prefill_s

    def route(self, req: RequestFacts, backends: Sequence[BackendView], now: float) -> Dispatch | None:
        slots = slots_of(backends)
        if not slots:
            return None
        fp = req.fingerprint
        cum = self._cum(fp)
        prompt = max(req.prompt_tokens, cum[-1])
        common_blocks = self.common.prefix_blocks(fp)
        common_tokens = cum[common_blocks]
        surplus = {b.name: self._surplus(b, now) for b in backends}

        n: list[float] = []
        matched: list[int] = []
        prefill: list[float] = []
        ttft: list[float] = []
        waits: list[float] = []
        for slot, view in slots:
            self.index.set_capacity(slot, view.kv_tokens)
            extra_n, extra_wait = surplus[view.name]
            st = self._slots.get(slot)
            wait = (max(0.0, st.busy_until - now) if st else 0.0) + extra_wait
            inflight = (st.inflight if st else 0) + extra_n
            cap = view.max_running_requests
            if 0 < cap <= inflight:  # a running slot frees every mean decode / cap seconds
                wait += (inflight + 1 - cap) * self._mean_decode_s / cap
            c = self.index.matched_tokens(slot, fp, cum)
            p = self._prefill(view.name, prompt, c)
            n.append(inflight)
            matched.append(c)
            prefill.append(p)
            waits.append(wait)
            ttft.append(wait + p)

        count = len(slots)
        mean_after = (sum(n) + 1) / count
        # Leaving the cache costs a recompute (``lost_s``): the dearer it is, the hotter a slot
        # must be before the gate sends the request elsewhere.
        lost_s = max(prefill) - min(prefill)
        ratio = min(self.gate_max, self.gate_ratio * (1 + lost_s / self.gate_move_s))
        limit = max(ratio * mean_after, mean_after + self.gate_slack)
        allowed = [i for i in range(count) if n[i] + 1 <= limit] or list(range(count))
        best_all = min(range(count), key=ttft.__getitem__)
        best_match = max(matched)

        if best_match > common_tokens:
            # Leaving the cache costs the recompute now and the copy it makes (the next request of
            # the prefix finds it in two places, each holding less else): ``stay`` × the extra prefill.
            cheapest = min(prefill)
            score = [ttft[i] + self.stay * (prefill[i] - cheapest) for i in range(count)]
            best = min(score[i] for i in allowed)
            band = best + max(self.tie_abs_s, self.tie_rel * best)
            near = [i for i in allowed if score[i] <= band]
            longest = max(matched[i] for i in near)
            chosen = self._rng.choice([i for i in near if matched[i] == longest])
            reason = "prefix" if matched[chosen] == best_match else "least_wait"
        else:
            # Only the queue ahead decides among cold slots: the common prefix is cheap to cache
            # where it is not yet (comparing whole TTFTs would keep it on the slots that have it).
            pool = allowed
            foreign = sum(surplus[b.name][0] * max(1, b.dp_size) for b in backends)
            if foreign <= self.solo_share * (sum(n) + 1):
                # This router sees (nearly) all the load, so its queue view is the backends': the
                # queue ahead decides. Else other replicas send too and see other queues: hashing
                # alone keeps them agreeing on where a conversation lives.
                least = min(waits[i] for i in allowed)
                band = least + max(self.tie_abs_s, self.tie_rel * least)
                pool = [i for i in allowed if waits[i] <= band]
            chosen = self._cold(self._key(fp, common_blocks, req), prompt, slots, pool, now)
            reason = "cold_hash"
        if reason != "cold_hash" and best_all not in allowed and chosen != best_all:
            reason = "imbalance"

        slot, view = slots[chosen]
        scores = {
            "prompt_tokens": float(prompt),
            "common_tokens": float(common_tokens),
            "matched_tokens": float(matched[chosen]),
            "best_match_tokens": float(best_match),
            "expected_ttft_s": ttft[chosen],
            "wait_s": waits[chosen],
            "candidates": float(count),
        }
        for i in sorted(range(count), key=ttft.__getitem__)[:8]:
            scores[f"ttft_s:{slot_label(slots[i][0])}"] = ttft[i]
        return make_dispatch(req.rid, slot, reason, scores, matched[chosen])

    @staticmethod
    def _key(fp: Fingerprint, common_blocks: int, req: RequestFacts) -> int:
        """A conversation's identity: its first distinguishing block (the same for all its turns)."""
        return fp[min(common_blocks, len(fp) - 1)][0] if fp else stable_hash(req.conversation or req.rid)

    def _working_sets(self, slots: list[tuple[Slot, BackendView]], key: int, now: float) -> list[int]:
        """Each slot's recent working set in tokens, without this conversation's previous turn."""
        load = [self.footprint.tokens(s, now) for s, _ in slots]
        own = self.footprint.own(key)
        if own is not None:
            for i, (s, _) in enumerate(slots):
                if s == own[0]:
                    load[i] -= own[1]
        return load

    def _cold(self, key: int, prompt: int, slots: list[tuple[Slot, BackendView]], pool: list[int], now: float) -> int:
        """Bounded-load rendezvous over the ``pool`` slots, load = recent working set in tokens."""
        load = self._working_sets(slots, key, now)
        # One request's worth of slack (a strict bound would depend on each replica's own
        # history while few conversations run); the least loaded slot always fits.
        least = min(load[i] for i in pool)
        bound = max(self.load_factor * (sum(load) + prompt) / len(slots) + prompt, least + prompt)
        position = {slots[i][0]: i for i in pool}
        return next(
            i for i in (position[s] for s in self._rendezvous.order(key, list(position))) if load[i] + prompt <= bound
        )

    def matched_tokens(self, req: RequestFacts, backend: str, rank: int | None) -> int:
        """Tokens of ``req`` that ``backend`` (rank) probably holds, by this router's index."""
        fp = req.fingerprint
        last, cum = self._cum_of
        return self.index.matched_tokens((backend, rank), fp, cum if fp is last else self._cum(fp))

    def swap_index(self, make: Callable[[PrefixIndex], PrefixIndex]) -> PrefixIndex:
        self.index = make(self.index)
        return self.index

    def dispatched(self, req: RequestFacts, decision: Dispatch, now: float) -> None:
        backend = decision.backend
        slot = (backend, decision.rank)  # slot_of(decision)
        rid, fp = req.rid, req.fingerprint
        last, cum = self._cum_of
        if fp is not last:  # else self._cum(fp) would give cum again
            cum = self._cum(fp)
        prompt, held = req.prompt_tokens, cum[-1]
        prompt = held if held > prompt else prompt  # max(prompt_tokens, cum[-1]) without the call
        cached = self.index.matched_tokens(slot, fp, cum)
        p = self.model.seconds(prompt - cached, cached) / self.speed.get(backend, 1.0)  # _prefill
        entries = self._entries
        old = entries.get(rid)
        if old is not None:  # dispatched again before it finished: it counts where it went last
            old.state.inflight -= 1
            self._prefill_done(old, rid, now)  # and its prefill leaves the queue it joined first
        st = self._slots.get(slot)
        if st is None:
            st = self._state(slot)
        busy = st.busy_until
        start = now if now > busy else busy  # max(busy, now) without the call (max's own comparison)
        st.busy_until = start + p
        st.pending_s += p
        st.pending.add(rid)
        recent = st.pending_recent
        recent.set(recent.value + 1, now)
        recent = st.inflight_recent
        recent.set(recent.value + 1, now)
        st.inflight += 1
        entries[rid] = _Entry(slot, fp, prompt, cached, p, start - now, now, st)
        common = self.common
        self.footprint.touch(slot, self._key(fp, common.prefix_blocks(fp), req), prompt, now)
        self.index.insert(slot, fp)
        common.observe(fp)
        self._mean_prefill_s += 0.05 * (p - self._mean_prefill_s)

    def _prefill_done(self, e: _Entry, rid: str, now: float) -> None:
        st = e.state
        pending = st.pending
        if rid not in pending:
            return
        pending.discard(rid)
        left = st.pending_s - e.prefill_s
        st.pending_s = (left if left > 0.0 else 0.0) if pending else 0.0  # max(0.0, left) without the call
        # What is still queued starts now (the engine prefills one batch after another).
        st.busy_until = now + st.pending_s
        recent = st.pending_recent
        recent.set(recent.value - 1, now)

    def first_token(self, rid: str, now: float) -> None:
        e = self._entries.get(rid)
        if e is None or e.ttft is not None:
            return
        e.ttft = now - e.dispatched_at
        self._prefill_done(e, rid, now)

    def finished(self, rid: str, backend: str, outcome: Outcome, now: float) -> None:
        e = self._entries.pop(rid, None)
        if e is None:
            return
        e.state.inflight -= 1
        recent = e.state.inflight_recent
        recent.set(recent.value - 1, now)
        if e.ttft is None:  # else its first token ended its prefill already
            self._prefill_done(e, rid, now)
        if e.ttft is not None:  # how long a request holds a running slot once it has its first token
            self._mean_decode_s += 0.05 * (now - e.dispatched_at - e.ttft - self._mean_decode_s)
        if outcome.ok and outcome.reached_backend:
            self.index.insert(e.slot, e.fp)  # the engine caches the prompt again as it finishes
            self._learn(e, outcome)

    def _learn(self, e: _Entry, outcome: Outcome) -> None:
        if e.ttft is None or e.ttft <= 0 or e.wait_s > 0:
            return
        if outcome.prompt_tokens > 0:
            base = self.model.seconds(outcome.prompt_tokens - outcome.cached_tokens, outcome.cached_tokens)
        else:
            base = self.model.seconds(e.prompt - e.cached, e.cached)
        if base < self.min_learn_s:
            return
        sample = min(10.0, max(0.1, base / e.ttft))
        backend = e.slot[0]
        speed = self.speed.get(backend, 1.0)
        self.speed[backend] = min(10.0, max(0.1, speed + self.learn_alpha * (sample - speed)))
