"""Seat sizing: what a seat needs, and each slot's seat budget counting every tier.

A slot's budget is ``water · C · share`` with ``C = C_gpu + host_water · C_host`` when the backend reloads
from a host tier (else ``C_gpu``; 0: unknown, unbounded), ``kv_overbook · C · share`` for both marks while
the whole demand fits that (``_set_kv_factor``), and at most
``ceil(running_overbook · max_running_requests · share)`` seats. A waiter may take an idle seat
after ``clip(tokens / reload_tokens_per_s / swap_overhead, min_hold_s, quantum_s)`` with a host
tier, else ``quantum_s``. Parameters and defaults: ``SeatParams``.
"""

from __future__ import annotations

import math

from policies.admission.blocks import SlotBlocks
from policies.admission.params import SeatParams
from policies.admission.records import ModelViews, Seat, Waiter
from policies.types import BackendView, Fingerprint, RequestFacts, Slot


class SeatSizing:
    """Seat budgets per slot; mixed into ``SeatedAdmission``, whose state it reads."""

    params: SeatParams
    share: float
    models: dict[str, ModelViews]
    seats: dict[str, Seat]
    seat_counts: dict[Slot, int]
    """Seats by slot (kept with ``seats``: counting them per question was a scan over every seat)."""
    reserved: dict[Slot, int]
    """Tokens reserved per slot: every seat's, with the prompt blocks seats share counted once (``blocks.py``)."""
    blocks: dict[Slot, SlotBlocks]
    anchors: dict[int, str]
    waiting: dict[str, Waiter]
    _by_name: dict[str, BackendView]
    """Each backend's view (the first model's that lists it); ``_views_changed`` rebuilds it."""
    _kv_factor: float = 1.0
    """``kv_overbook`` or 1 (``_set_kv_factor``)."""
    _kv_at: float = -1e18
    _recent: dict[str, tuple[int, float]]
    """Each conversation's last size and when it was last seen (arrival or end of a turn)."""
    _slot_lists: dict[str, tuple[SeatParams, list[tuple[Slot, int]]]]
    """``_slots`` of each model without exclusions (and the parameters it was computed with), until
    ``_views_changed``: the placement asks for it for every waiter on every event."""

    def _views_changed(self) -> None:
        """The backend views changed (``set_backends``): drop what was derived from them."""
        self._by_name = {}
        for entry in self.models.values():
            for name, view in entry.views.items():
                self._by_name.setdefault(name, view)
        self._slot_lists = {}

    def _need(self, req: RequestFacts) -> int:
        out = min(req.max_output_tokens or self.params.default_output, self.params.output_clip)
        return req.prompt_tokens + out

    def _healthy(self, model: str, exclude: frozenset[str] = frozenset()) -> bool:
        entry = self.models.get(model)
        if entry is not None:
            for v in entry.views.values():  # a loop, not any(): no generator per request
                if v.healthy and v.name not in exclude:
                    return True
        return False

    def _slots(self, model: str, exclude: frozenset[str]) -> list[tuple[Slot, int]]:
        """Every healthy (backend, rank) of ``model`` with its capacity (0: unknown, unbounded). The
        list is shared: callers do not change it."""
        if exclude:
            return self._slots_of(model, exclude)
        cached = self._slot_lists.get(model)
        if cached is None or cached[0] is not self.params:  # host_water is part of the capacity
            cached = self._slot_lists[model] = (self.params, self._slots_of(model, exclude))
        return cached[1]

    def _slots_of(self, model: str, exclude: frozenset[str]) -> list[tuple[Slot, int]]:
        entry = self.models.get(model)
        if entry is None:
            return []
        slots: list[tuple[Slot, int]] = []
        for view in entry.views.values():
            if not view.healthy or view.name in exclude:
                continue
            cap = self._tier_capacity(view)
            if view.dp_size > 1:
                slots += [((view.name, r), cap) for r in range(view.dp_size)]
            else:
                slots.append(((view.name, None), cap))
        return slots

    def _capacity(self, slot: Slot) -> int:
        """Capacity of ``slot`` (0: unknown, or no such slot): a rank of a DP backend, else rank None."""
        view = self._view_of(slot[0])
        if view is None:
            return 0
        rank = slot[1]
        exists = rank in range(view.dp_size) if view.dp_size > 1 else rank is None
        return self._tier_capacity(view) if exists else 0

    def _budget(self, capacity: int, growth: bool = False) -> float:
        if self._kv_factor > 1.0:  # the whole demand fits kv_overbook × the pool: no marks, no protection
            return capacity * self.share * self._kv_factor if capacity else float("inf")
        water = self.params.high_water if growth else self.params.admit_water
        return water * capacity * self.share if capacity else float("inf")

    def _set_kv_factor(self, now: float) -> None:
        """``kv_overbook`` while the demand (the last size of every conversation running, or that arrived or
        ended a turn within ``full_idle_release_s``; a longer waiter is not counted) fits it times the
        capacity, else 1: an overflow that small the engine's LRU absorbs at a small recompute, while a
        working set well past the pool would thrash it (then the seats protect the pool). Counted at most
        once a second, and when a new conversation arrives."""
        p = self.params
        if p.kv_overbook <= 1.0 or now - self._kv_at < 1.0:
            return
        self._kv_at = now
        self._kv_factor = 1.0
        capacity = 0
        for view in self._by_name.values():
            cap = self._tier_capacity(view)
            if not cap or not view.healthy:
                return  # unknown capacity: no budget to scale
            capacity += cap * max(1, view.dp_size)
        horizon = now - p.full_idle_release_s  # longer than a think: a conversation idle longer has ended
        demand = 0
        for key, (tokens, seen) in list(self._recent.items()):
            seat = self.seats.get(key)
            if seen < horizon and (seat is None or not seat.busy):
                del self._recent[key]
            else:
                demand += tokens
        if demand <= p.kv_overbook * capacity * self.share:
            self._kv_factor = p.kv_overbook

    def _hold_blocks(self, seat: Seat, fp: Fingerprint) -> int:
        """``seat`` now holds ``fp``'s blocks instead of its earlier prompt's; the change in what other seats
        share with it (what its tokens do not add to its slot's reservation)."""
        blocks = self.blocks.get(seat.slot) or self.blocks.setdefault(seat.slot, SlotBlocks())
        shared = blocks.add(fp) - blocks.remove(seat.fp)
        seat.fp = fp
        return shared

    def _held(self, w: Waiter, slot: Slot) -> int:
        """Tokens of ``w``'s prompt that seats on ``slot`` already hold (a shared prefix: no new KV there)."""
        blocks = self.blocks.get(slot) if self.params.shared_blocks else None
        return blocks.held_prefix(w.req.fingerprint) if blocks is not None and w.req.fingerprint else 0

    def _fits(self, need: int, slot: Slot, capacity: int) -> bool:
        budget = self._budget(capacity)
        used = self.reserved.get(slot, 0)
        # A conversation larger than the whole budget still gets an empty backend to itself.
        return used + min(need, budget) <= budget and self._seats_on(slot) < self._seat_limit(slot)

    # ----- every tier: host tier, reload cost, running cap ---------------------------------------
    # Kept apart from the seat mechanics above so that the two can change independently.

    def _view_of(self, backend: str) -> BackendView | None:
        return self._by_name.get(backend)

    def _tier_capacity(self, view: BackendView) -> int:
        """Seat budget base of one rank: its GPU pool plus ``host_water`` of a host tier it reloads from."""
        if not view.kv_tokens:
            return 0
        if view.host_tokens and view.reload_tokens_per_s > 0:
            return int(view.kv_tokens + self.params.host_water * view.host_tokens)
        return view.kv_tokens

    def _quantum(self, slot: Slot, tokens: int) -> float:
        """How long a waiter waits before it may take an idle seat on ``slot``: the seat's swap cost
        over ``swap_overhead`` when the backend reloads from a host tier, else ``quantum_s``."""
        p = self.params
        view = self._view_of(slot[0])
        if view is None or not view.host_tokens or view.reload_tokens_per_s <= 0:
            return p.quantum_s
        swap_s = tokens / view.reload_tokens_per_s
        return min(p.quantum_s, max(p.min_hold_s, swap_s / p.swap_overhead))

    def _seat_limit(self, slot: Slot) -> float:
        """Seats a rank may hold: ``running_overbook`` × its ``max_running_requests`` (unknown: no limit)."""
        view = self._view_of(slot[0])
        if view is None or view.max_running_requests <= 0:
            return float("inf")
        return math.ceil(self.params.running_overbook * view.max_running_requests * self.share - 1e-9)

    def _release(self, seat: Seat) -> None:
        """Give up ``seat``: its tokens and its place in the rank's seat count."""
        if self.seats.get(seat.key) is seat:
            del self.seats[seat.key]
            self.seat_counts[seat.slot] -= 1
        freed = seat.tokens
        if seat.fp:
            blocks = self.blocks.get(seat.slot)
            if blocks is not None:
                freed -= blocks.remove(seat.fp)
            seat.fp = ()
        self.reserved[seat.slot] = self.reserved.get(seat.slot, 0) - freed
        if seat.anchor is not None and self.anchors.get(seat.anchor) == seat.key:
            del self.anchors[seat.anchor]

    def _over_limit(self, seat: Seat) -> bool:
        """Whether ``seat`` (not a lent one) is on a rank holding more seats of its own than its seat limit:
        only when the limit fell (a learned one, ``policies/adaptive_limit.py``); lent seats never count."""
        if seat.one_shot:
            return False
        owned = sum(1 for s in self.seats.values() if s.slot == seat.slot and not s.one_shot)
        return owned > self._seat_limit(seat.slot)

    def _limit_stands_for_kv(self, slot: Slot) -> bool:
        """Whether ``slot``'s seat limit is all that guards its engine's cache: a backend that reports no
        capacity but a running limit (an endpoint's limit learned from latency, ``policies/adaptive_limit.py``).
        There the limit marks where the cache starts to thrash, so waiters rotate through idle seats by the
        quantum and the wait bound, as where the KV binds, instead of borrowing running slots past it."""
        view = self._view_of(slot[0])
        return view is not None and not view.kv_tokens and view.max_running_requests > 0

    def _running_cap(self, slot: Slot) -> float:
        """Requests a rank runs at once, this replica's share (0 when unknown: nothing is lent)."""
        view = self._view_of(slot[0])
        if view is None or view.max_running_requests <= 0:
            return 0.0
        return math.floor(view.max_running_requests * self.share + 1e-9)

    def _seats_on(self, slot: Slot) -> int:
        return self.seat_counts.get(slot, 0)

    def _idle_release_s(self, seat: Seat) -> float:
        """Idle time after which a seat is released: ``idle_release_s``, or ``full_idle_release_s``
        on a rank whose running-cap seats are all taken while others wait (an ended conversation
        must not hold one of a handful of seats for half a minute)."""
        p = self.params
        if self.waiting and self._seats_on(seat.slot) >= self._seat_limit(seat.slot):
            return min(p.idle_release_s, p.full_idle_release_s)
        return p.idle_release_s
