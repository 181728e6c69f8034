"""Applying a finished pass: prefill chunks into the radix cache, decode steps, finished requests."""

from __future__ import annotations

import heapq

from backends.sim.engine_memory import KvRelease
from backends.sim.engine_state import DONE, GEN_WINDOW_S, PREFILL, RUNNING, RankState, ReqState
from backends.sim.engine_types import EngineEvent, default_output_block


class PassApply(KvRelease):
    """Mixed into ``Engine``: what a completed pass does to the ranks' state."""

    _seq: int

    def _finish_prefill(
        self, rk: RankState, items: list[tuple[ReqState, int, int]], now: float, ev: list[EngineEvent]
    ) -> None:
        for r, chunk, _ in items:
            if chunk < 0 or r.state != PREFILL:
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
            r.state = RUNNING
            r.step_base = rk.steps
            rk.running[r.rid] = r
            rk.ctx_sum += r.prompt_len + r.gen
            if r.gen >= r.target:
                self._finish(rk, r, now, ev)
            else:
                r.fin_step = rk.steps + (r.target - r.gen)
                self._seq += 1
                heapq.heappush(rk.fin_heap, (r.fin_step, self._seq, r))

    def _insert_computed(self, rk: RankState, r: ReqState) -> None:
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

    def _finish_decode(self, rk: RankState, now: float, ev: list[EngineEvent]) -> None:
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
            if r.state == RUNNING and r.fin_step == fin and rk.running.get(r.rid) is r:
                self._finish(rk, r, now, ev)

    def _note_gen(self, rk: RankState, now: float, n: int) -> None:
        w = rk.gen_window
        w.append((now, n))
        rk.gen_window_sum += n
        while w and w[0][0] < now - GEN_WINDOW_S:
            rk.gen_window_sum -= w.popleft()[1]

    def _finish(self, rk: RankState, r: ReqState, now: float, ev: list[EngineEvent]) -> None:
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
        r.state = DONE
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
