"""Giving KV back: aborts, releases, retraction under memory pressure (SGLang's retract_decode)."""

from __future__ import annotations

from backends.sim.engine_state import DONE, RUNNING, WAITING, RankState, ReqState
from backends.sim.engine_types import EngineCounters, EngineEvent
from backends.sim.profile_model import Profile


class KvRelease:
    """Mixed into ``Engine``: the methods that free a request's KV, over the engine's state."""

    profile: Profile
    counters: EngineCounters
    _ranks: list[RankState]
    _reqs: dict[str, ReqState]
    _pending: list[EngineEvent]
    _ratio_min: float
    _ratio_decay: float

    def abort(self, rid: str, now: float) -> bool:
        r = self._reqs.pop(rid, None)
        if r is None:
            return False
        rk = self._ranks[r.rank]
        if r.state == WAITING:
            if r in rk.waiting:
                rk.waiting.remove(r)
            # else still being tokenised: its arrival entry is skipped (state DONE below)
        else:
            self._release(rk, r)
            if r.state == RUNNING:
                del rk.running[rid]
                rk.ctx_sum -= r.prompt_len + rk.gen_of(r)
            if rk.chunked is r:
                rk.chunked = None
        r.state = DONE
        self.counters.aborted += 1
        return True

    def _abort_with_event(self, rk: RankState, r: ReqState, now: float, message: str) -> None:
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

    def _release(self, rk: RankState, r: ReqState) -> None:
        """Free a request's private KV and unlock its path (the computed prefix stays cached)."""
        rk.private -= rk.private_of(r)
        rk.cache.unlock(r.node)
        r.node = rk.cache.root
        r.nblk = 0
        r.tree_len = 0
        r.kv = 0
        r.pending = 0

    def _retract(self, rk: RankState, r: ReqState) -> None:
        gen = rk.gen_of(r)
        self._release(rk, r)
        if r.state == RUNNING:
            del rk.running[r.rid]
            rk.ctx_sum -= r.prompt_len + gen
        if rk.chunked is r:
            rk.chunked = None
        r.gen = gen
        r.fill_len = r.prompt_len + gen  # SGLang re-prefills input + output so far
        r.state = WAITING
        r.retractions += 1
        rk.waiting.append(r)  # 0.5.23 `_add_request_to_queue`: appended; FCFS does not re-sort
        c = self.counters
        c.retractions += 1
        c.retracted_input_tokens += r.prompt_len
        c.retracted_output_tokens += gen

    def _maybe_retract(self, rk: RankState, now: float) -> None:
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
