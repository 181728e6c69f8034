"""Fair order of the waiting room, placement of a new seat, and which idle seats give way.

Order: priority band (team's ``priority`` + the request's, higher first), then the team's virtual
token counter (lowest first), then arrival. Placement: the router chooses among the slots where the
seat fits (and that can ever hold the prompt, ``request_limits.can_hold``), never the slot a blocked
head waits for (``avoid``: backfill); else the fitting slot with the least reserved. Victims
(idle, held ``min_hold_s``, or ``quantum_s`` per ``rotate_on``; not for the quantum where only the
running cap keeps the waiter out and ``rotate_by`` is "lend": it borrows a running slot instead,
``_lend``) are chosen per slot so that the fewest seats are released, most-served team first,
then oldest seat. Parameters and defaults: ``SeatParams``.
"""

from __future__ import annotations

from policies.admission.records import Placement, Running, Seat, Waiter
from policies.admission.sizing import SeatSizing
from policies.request_limits import can_hold, head_slot
from policies.routing import Router
from policies.teams import TeamState
from policies.types import Slot


class FairOrder(SeatSizing):
    """Selection for ``SeatedAdmission``; mixed in, it reads the core's teams and router."""

    teams: dict[str, TeamState]
    router: Router
    running: dict[str, Running]

    def _band(self, w: Waiter) -> int:
        return self.teams[w.req.team].limits.priority + w.req.priority

    def _rank(self, w: Waiter) -> tuple[int, float, float, int]:
        team = self.teams[w.req.team]  # _band's lookup, once
        return (-(team.limits.priority + w.req.priority), team.vtc, w.arrived, w.seq)

    def _order(self, waiters: list[Waiter]) -> list[Waiter]:
        return sorted(waiters, key=self._rank) if len(waiters) > 1 else waiters

    def _take(self, w: Waiter) -> None:
        """``w`` leaves the waiting room (it is dispatched)."""
        del self.waiting[w.req.rid]
        self.teams[w.req.team].waiting -= 1

    def _deadline(self, w: Waiter) -> float:
        """How long ``w`` may wait before it is overdue: its team's ``max_wait_s`` less ``wait_lead_s``."""
        return max(0.0, self.teams[w.req.team].limits.max_wait_s - self.params.wait_lead_s)

    def _last_call(self, w: Waiter) -> float:
        """How long ``w`` waits for an idle seat before it goes past the budget: half of ``wait_lead_s`` after
        its deadline (the other half still left for the engine)."""
        return max(0.0, self.teams[w.req.team].limits.max_wait_s - self.params.wait_lead_s / 2)

    def _overdue(self, w: Waiter, now: float) -> bool:
        return now - w.arrived >= self._deadline(w)

    def _order_now(self, waiters: list[Waiter], now: float) -> list[Waiter]:
        """``_order``, overdue waiters first (oldest first): the bound goes before fairness and seats."""
        ordered = self._order(waiters)
        overdue = [w for w in ordered if self._overdue(w, now)]
        if not overdue:
            return ordered
        overdue.sort(key=lambda w: (w.arrived, w.seq))
        return overdue + [w for w in ordered if not self._overdue(w, now)]

    def _patience(self, w: Waiter, slot: Slot, seat_tokens: int) -> float:
        """How long ``w`` waits before an idle seat of ``seat_tokens`` on ``slot`` gives way to it: the
        quantum (``_quantum``: the swap cost over ``swap_overhead`` with a host tier), never past its deadline."""
        return min(self._quantum(slot, seat_tokens), self._deadline(w))

    def _head_slot(self, w: Waiter) -> Slot | None:
        """The slot a blocked head waits for (``policies/request_limits.py::head_slot``)."""
        return head_slot(
            self._slots(w.req.model, w.req.exclude), w.need, lambda s: self.reserved.get(s, 0), self._budget
        )

    def _place(self, w: Waiter, now: float, avoid: Slot | None = None) -> Placement | None:
        """A slot with room for a new seat (not ``avoid``: a blocked head's), chosen by the router
        among those that fit and can ever hold the prompt."""
        fitting = {
            slot
            for slot, cap in self._slots(w.req.model, w.req.exclude)
            if slot != avoid
            and self._fits(w.need - self._held(w, slot), slot, cap)
            and can_hold(w.req.prompt_tokens, cap, self.params.high_water)
        }
        if not fitting:
            return None
        return self._choose(w, fitting, now)

    def _lend(self, w: Waiter, now: float) -> Placement | None:
        """A slot whose running cap, not its KV, keeps ``w`` from a seat while at least ``lend_free`` of its
        running slots are free now (one, once ``w`` has waited the quantum and ``rotate_by`` is "lend"):
        ``w`` borrows one for this turn (a one-shot seat, released when the turn ends). Seated
        conversations spend part of each cycle thinking; lending their idle running slots keeps the
        cap busy without seating more conversations than it serves."""
        p = self.params
        rotating = p.rotate_by == "lend" and p.rotate_on == "waiter"
        if p.lend_free <= 0 and not rotating:
            return None
        slots = self._slots(w.req.model, w.req.exclude)
        free: dict[Slot, int] = {}  # running slots that must be free on each rank where it may borrow
        for slot, _ in slots:
            # rotate_by "lend": a waiter that has waited the quantum takes any free running slot where the
            # running cap (the seat limit) is what keeps it out
            # past cap_patience_s it takes a free running slot, past cap_queue_s it joins the engine's queue
            # there (no free slot needed: nothing is evicted)
            # (both at most the quantum / the deadline)
            if self._limit_stands_for_kv(slot):
                continue  # a learned limit guards the engine's cache: waiters rotate by evicting, as on KV
            waited = now - w.arrived
            patience = self._patience(w, slot, w.need)
            if (
                rotating
                and waited >= min(p.cap_patience_s, patience)
                and self._seats_on(slot) >= self._seat_limit(slot)
            ):
                free[slot] = 0 if waited >= min(p.cap_queue_s, self._deadline(w)) else 1
            elif p.lend_free > 0:
                free[slot] = p.lend_free
        if not free:
            return None  # before counting the running requests and asking the router (most calls end here)
        busy: dict[Slot, int] = {}
        lent: dict[Slot, int] = {}
        for run in self.running.values():
            busy[run.slot] = busy.get(run.slot, 0) + 1
            if run.lent:
                lent[run.slot] = lent.get(run.slot, 0) + 1
        room = [
            slot
            for slot, cap in slots
            if slot in free
            and (free[slot] == 0 or busy.get(slot, 0) + free[slot] <= self._running_cap(slot))
            and (free[slot] == 0 or lent.get(slot, 0) < p.lend_max)
            and self.reserved.get(slot, 0) + min(w.need - self._held(w, slot), self._budget(cap)) <= self._budget(cap)
            and can_hold(w.req.prompt_tokens, cap, p.high_water)
        ]
        if not room:
            return None
        matched = {s: self.router.matched_tokens(w.req, *s) or 0 for s, _ in slots}
        best = max(matched.values(), default=0)
        if best >= p.lend_cached * w.req.prompt_tokens:
            room = [s for s in room if matched[s] >= best]  # where its KV is: no recompute
        fitting = set(room)
        if not fitting:
            return None
        place = self._choose(w, fitting, now)
        return Placement(place.slot, "lent", place.scores, place.matched_tokens)

    def _overbook(self, w: Waiter, now: float) -> Placement | None:
        """An overdue ``w`` that no seat can be made for: the router's slot among those that can ever hold
        its prompt, past the seat budget (the engine's own behaviour: it queues or evicts)."""
        fitting = {
            slot
            for slot, cap in self._slots(w.req.model, w.req.exclude)
            if can_hold(w.req.prompt_tokens, cap, self.params.high_water)
        }
        if not fitting:
            return None
        place = self._choose(w, fitting, now)
        return Placement(place.slot, "overdue", place.scores, place.matched_tokens)

    def _choose(self, w: Waiter, fitting: set[Slot], now: float) -> Placement:
        """The router's choice among ``fitting`` slots, else the one with the least reserved."""
        entry = self.models[w.req.model]
        names = {slot[0] for slot in fitting}
        choice = self.router.route(w.req, [v for n, v in entry.views.items() if n in names], now)
        if choice is not None:
            slot = (choice.backend, choice.rank if entry.views[choice.backend].dp_size > 1 else None)
            if slot in fitting:
                return Placement(slot, choice.reason, choice.scores, choice.matched_tokens)
            same = [s for s in fitting if s[0] == choice.backend]
            if same:  # the router's backend, on a rank that has room
                return Placement(min(same, key=lambda s: self.reserved.get(s, 0)), choice.reason, choice.scores)
        slot = min(fitting, key=lambda s: (self.reserved.get(s, 0), s[0], s[1] or 0))
        return Placement(slot, "least_wait", {})

    def _victims(self, w: Waiter, now: float, slot: Slot | None = None, extra: int | None = None) -> list[Seat] | None:
        """Idle seats whose release lets ``w`` fit: on ``slot`` for ``extra`` more tokens (a seated
        conversation that grew), else on whichever slot needs the fewest released; None if none may go."""
        p = self.params
        team = self.teams[w.req.team]
        best: tuple[int, list[Seat]] | None = None
        queued = {other.key for other in self.waiting.values()}
        slots = [(s, c) for s, c in self._slots(w.req.model, w.req.exclude) if slot is None or s == slot]
        idle: dict[Slot, list[Seat]] = {}  # one pass over the seats, each slot's in seat order
        for seat in self.seats.values():
            if not seat.busy and seat.key != w.key and seat.key not in queued:
                idle.setdefault(seat.slot, []).append(seat)
        for candidate, cap in slots:
            need = w.need - self._held(w, candidate) if extra is None else extra
            budget = self._budget(cap, growth=extra is not None)
            used = self.reserved.get(candidate, 0)
            # rotate_by "lend": where only the running cap keeps w out, the quantum lends (``_lend``), not evicts
            by_quantum = self._limit_stands_for_kv(candidate) or not (
                p.rotate_by == "lend"
                and extra is None
                and used + min(need, budget) <= budget
                and self._seats_on(candidate) >= self._seat_limit(candidate)
            )
            victims = []
            for seat in idle.get(candidate, ()):
                held = now - seat.since
                owner = self.teams[seat.team]
                favoured = extra is not None or owner.vtc > team.vtc or self._band(w) > owner.limits.priority
                quantum = self._patience(w, candidate, seat.tokens)
                if p.rotate_on == "waiter" and by_quantum:
                    favoured = favoured or now - w.arrived >= quantum
                if (p.rotate_on == "seat" and held >= quantum) or (favoured and held >= p.min_hold_s):
                    victims.append(seat)
            victims.sort(key=lambda s: (-self.teams[s.team].vtc, s.since))
            # a new seat also needs a seat under the running cap; a growing one already has its own
            seats = self._seats_on(candidate) if extra is None else -1
            limit = self._seat_limit(candidate)
            chosen: list[Seat] = []
            blocks = self.blocks.get(candidate)
            for seat in victims:
                if used + min(need, budget) <= budget and seats < limit:
                    break
                used -= seat.tokens - (blocks.shared_of(seat.fp) if blocks is not None and seat.fp else 0)
                seats -= 1
                chosen.append(seat)
            fits = used + min(need, budget) <= budget and seats < limit
            if fits and chosen and (best is None or len(chosen) < best[0]):
                best = (len(chosen), chosen)
        return None if best is None else best[1]
