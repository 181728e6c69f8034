"""SGLang's PrefillAdder on one rank: which waiting requests join the next prefill batch, and how much.

FCFS (or LPM below 129 waiting); the head needs ``extend + min(max_new, 4096) + page`` below
free + evictable − Σ_running min(left, 4096) × new_token_ratio and is never skipped; one chunked
request at a time, continued first; ``max_prefill_tokens``, ``chunked_prefill_size`` and
``max_running_requests`` bound the batch; a host-tier prefix is loaded back instead of recomputed.
"""

from __future__ import annotations

from backends.sim.engine_memory import KvRelease
from backends.sim.engine_state import PREFILL, WAITING, RankState, ReqState


class PrefillAdder(KvRelease):
    """Mixed into ``Engine``: forms a rank's prefill batch."""

    def _offset(self, rk: RankState) -> float:
        clip = self.profile.clip_max_new_tokens
        steps = rk.steps
        total = 0
        for r in rk.running.values():
            left = r.max_new - (r.gen + steps - r.step_base)
            total += left if left < clip else clip
        return total * rk.ratio

    def _match(self, rk: RankState, r: ReqState) -> tuple[int, int]:
        if r.m_epoch != rk.cache.epoch:
            r.m_gpu, r.m_host = rk.cache.match(r.blocks)
            r.m_epoch = rk.cache.epoch
        return r.m_gpu, r.m_host

    def _prefix_tokens(self, rk: RankState, r: ReqState) -> int:
        g, h = self._match(rk, r)
        return r.ends[g + h - 1] if g + h else 0

    def _policy_order(self, rk: RankState) -> list[ReqState]:
        """The waiting queue in admission order: FCFS, or LPM (stable) below 129 waiting."""
        if self.profile.schedule_policy == "lpm" and len(rk.waiting) <= 128:
            return sorted(rk.waiting, key=lambda q: -self._prefix_tokens(rk, q))
        return rk.waiting

    def _form_prefill(self, rk: RankState) -> list[tuple[ReqState, int, int]]:
        """PrefillAdder: the chunked request first, then the waiting queue in policy order."""
        if not rk.waiting and rk.chunked is None:
            return []
        p = self.profile
        page = p.page_size
        cache = rk.cache
        rem_input = p.max_prefill_tokens
        rem_chunk = p.chunked_prefill_size
        items: list[tuple[ReqState, int, int]] = []
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
            space = rk.free + cache.evictable_tokens - offset
            if need >= space and not (not rk.running and not items and extend + 1 <= space):
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
            r.state = PREFILL
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
            rk.waiting = [q for q in rk.waiting if q.state == WAITING]
            rk.hits.append((hit_tokens, in_tokens))
        return items
