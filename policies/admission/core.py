"""``SeatedAdmission``: the ``gateway`` stack's decision core, wiring team limits (``limits.py``),
seat sizing (``sizing.py``) and fair order (``order.py``) to the core's events."""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import ClassVar

from policies.admission.anchors import Anchoring
from policies.admission.limits import TeamGate
from policies.admission.order import FairOrder
from policies.admission.params import SeatParams
from policies.admission.records import ModelViews, Running, Seat, Waiter, conversation_of, snapshot_of, with_exclude
from policies.core import DecisionCore, Hook
from policies.routing import Router
from policies.teams import UNLIMITED, TeamLimits, TeamState, teams_from_config
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts, Slot, new_dispatch


class SeatedAdmission(TeamGate, FairOrder, Anchoring, DecisionCore):
    """The ``gateway`` decision core: team limits, fair queue, seats (``policies/admission/__init__.py``
    gives the reasoning).

    A seat reserves ``need = prompt_tokens + min(max_output_tokens or default_output, output_clip)``
    on a slot of capacity ``C`` (GPU pool + ``host_water`` · host tier); a new seat is granted while
    ``Σ seats + need ≤ admit_water · C`` and at most ``ceil(running_overbook · max_running_requests)``
    seats sit on a rank; seated turns grow up to ``high_water · C``, releasing idle seats held
    ``min_hold_s`` first. Waiting order: seated turns, then priority band, team virtual token counter
    (charged ``input_weight`` · prompt + ``output_weight`` · output tokens), arrival. Idle seats go
    after ``idle_release_s`` (``full_idle_release_s`` on a full rank with waiters), or to a waiter
    after the quantum (``quantum_s``; swap cost / ``swap_overhead`` with a host tier); where only the running
    cap keeps a waiter out, it borrows a free running slot for one turn at the quantum instead (``rotate_by``).
    Bounded waits: overdue (``max_wait_s − wait_lead_s``) a waiter goes first and takes idle seats; at
    ``max_wait_s − wait_lead_s / 2`` it goes past the budget; the running cap alone holds it
    ``cap_patience_s`` / ``cap_queue_s``.

    Parameters and defaults: ``SeatParams`` (``policies/admission/params.py``), every one listed there.
    Team limits (``TeamLimits``) come from ``teams`` (``default_team`` for those not listed).
    """

    hooks: ClassVar[frozenset[Hook]] = frozenset(
        {"configure", "set_team", "set_share", "wake", "requeue", "team", "snapshot"}
    )

    def __init__(
        self,
        router: Router,
        teams: Mapping[str, TeamLimits] | None = None,
        default_team: TeamLimits = UNLIMITED,
        params: SeatParams | None = None,
        name: str = "gateway",
    ) -> None:
        self.name = name
        self.router = router
        self.params = params or SeatParams()
        self.limits: dict[str, TeamLimits] = dict(teams or {})
        self.default_team = default_team
        self.teams: dict[str, TeamState] = {}
        self.models: dict[str, ModelViews] = {}
        self.seats: dict[str, Seat] = {}
        self.seat_counts: dict[Slot, int] = {}
        self._views_changed()  # the views' index (none yet)
        self.reserved: dict[Slot, int] = {}
        self.blocks, self.anchors, self._loose = {}, {}, deque()
        self.waiting: dict[str, Waiter] = {}
        self.running: dict[str, Running] = {}
        self._seq = itertools.count()
        self.share = 1.0
        self.split_concurrency = False
        self._clock = 0.0
        self._recent: dict[str, tuple[int, float]] = {}
        self._idle_floor = -math.inf
        """At most the ``last_active`` of every idle, unqueued seat since ``tick``'s last scan (seats only become
        idle with ``last_active = now``, except where this is reset): a tick skips the scan while under it."""

    # ----- configuration -------------------------------------------------------------------------

    def configure(self, config: Mapping[str, object]) -> None:
        """Take team limits and seat parameters from a config mapping:
        ``teams: {name: {max_concurrency, ...}}`` (the ``default`` entry applies to teams not listed)
        and ``admission: {high_water, admit_water, quantum_s, ...}``."""
        for name, limits in teams_from_config(config).items():
            if name == "default":
                self.default_team = limits
            self.set_team(name, limits)
        params = config.get("admission")
        if params:
            assert isinstance(params, Mapping)
            self.params = SeatParams(**dict(params))

    def set_team(self, name: str, limits: TeamLimits, now: float = 0.0) -> None:
        """Change a team's limits at run time (the admin API)."""
        self.limits[name] = limits
        if name in self.teams:
            self.teams[name].limits = limits

    def set_share(self, share: float, split_concurrency: bool, now: float) -> list[Decision]:
        """This replica's share of every limit when several replicas share the backends.

        ``share`` (1 / live replicas) scales each backend's seat budget, each team's queue bound and
        token rate; ``split_concurrency`` also scales team concurrency (when Redis leases cannot
        enforce it globally, i.e. Redis is unreachable).
        """
        self.share = max(1e-6, min(1.0, share))
        self.split_concurrency = split_concurrency
        return self._schedule(now)

    def wake(self, team: str, now: float) -> list[Decision]:
        """A lease of ``team`` was released somewhere: its requeued requests may try again."""
        state = self.teams.get(team)
        if state is not None:
            state.blocked_until = 0.0
        return self._schedule(now)

    def team(self, name: str, now: float) -> TeamState:
        state = self.teams.get(name)
        if state is None:
            state = self.teams[name] = TeamState(name, self.limits.get(name, self.default_team), now)
        return state

    # ----- events --------------------------------------------------------------------------------

    def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
        entry = self.models.setdefault(model, ModelViews())
        entry.views = {b.name: b for b in backends}
        self._views_changed()
        for seat in list(self.seats.values()):
            if seat.model == model:
                view = entry.views.get(seat.slot[0])
                if view is None or not view.healthy:
                    self._release(seat)
        return self._schedule(now)

    def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
        team = self.teams.get(req.team) or self.team(req.team, now)  # self.team(...), mostly without a call
        if not self._healthy(req.model, req.exclude):
            return [Refuse(req.rid, "no_healthy_backend", f"no healthy backend for model '{req.model}'", 5.0, 503)]
        need = self._need(req)
        refused = self._refuse_at_door(
            req, team, need, now, self.models[req.model].views.values(), self.params.high_water
        )
        if refused is not None:
            return [refused]
        key, one_shot = conversation_of(req, self.anchors)
        if not team.active:
            active = [t.vtc for t in self.teams.values() if t.active]
            if active:
                team.vtc = max(team.vtc, min(active))
        self.waiting[req.rid] = Waiter(req, key, need, now, next(self._seq), one_shot)
        if key not in self._recent:
            self._kv_at = -math.inf  # a conversation not counted yet: count the demand again
        self._recent[key] = (need, now)
        team.waiting += 1
        return self._schedule(now)

    def first_token(self, rid: str, now: float) -> list[Decision]:
        if rid in self.running:
            self.router.first_token(rid, now)
        return []

    def finish(self, rid: str, outcome: Outcome, now: float) -> list[Decision]:
        run = self.running.pop(rid, None)
        if run is None:
            return []
        w = run.waiter
        team = self.teams.get(w.req.team) or self.team(w.req.team, now)  # self.team(...), mostly without a call
        team.inflight -= 1
        if outcome.prompt_tokens or outcome.completion_tokens:
            actual = (
                self.params.input_weight * outcome.prompt_tokens + self.params.output_weight * outcome.completion_tokens
            )
            team.charge(actual - run.charged)
        seat = self.seats.get(w.key)
        if seat is not None and seat.slot == run.slot:
            seat.busy -= 1
            seat.last_active = now
            if outcome.prompt_tokens and outcome.completion_tokens:
                seat.tokens = self._reserve(seat, outcome.prompt_tokens + outcome.completion_tokens)
                self._recent[w.key] = (seat.tokens, now)
            if seat.one_shot or ((not outcome.reached_backend or outcome.refused) and seat.busy == 0):
                self._release(seat)
            elif (
                self.params.release_first_turns and seat.busy == 0 and seat.key == f"rid:{rid}"
            ):  # the first turn of no known conversation
                self._release_first_turn(seat, now)
        self.router.finished(rid, run.slot[0], outcome, now)
        return self._schedule(now) if self.waiting else []  # _schedule does nothing without waiters

    def cancel(self, rid: str, now: float) -> list[Decision]:
        waiter = self.waiting.pop(rid, None)
        if waiter is not None:
            self.team(waiter.req.team, now).waiting -= 1
            self._idle_floor = -math.inf
        return self._schedule(now)

    def requeue(self, rid: str, now: float) -> list[Decision]:
        """A dispatch could not take its team lease (another replica holds the slots): wait again."""
        run = self._undo(rid, now)
        if run is None:
            return []
        team = self.teams[run.waiter.req.team]
        self.waiting[rid] = run.waiter
        team.waiting += 1
        team.blocked_until = now + 1.0  # until a release anywhere wakes the team, or a second passes
        return []

    def retry(self, rid: str, failed_backend: str, now: float) -> list[Decision]:
        run = self._undo(rid, now)
        if run is None:
            return []
        w = run.waiter
        seat = self.seats.get(w.key)
        if seat is not None and seat.slot[0] == failed_backend:
            self._release(seat)
        retried = Waiter(with_exclude(w.req, failed_backend), w.key, w.need, w.arrived, w.seq, w.one_shot)
        place = self._place(retried, now)
        if place is None:
            return [Refuse(rid, "no_healthy_backend", "no other backend can take this request now", 5.0, 503)]
        return [self._dispatch(retried, place.slot, now, "retry", place.scores, place.matched_tokens)]

    def _undo(self, rid: str, now: float) -> Running | None:
        """Take back a dispatch that never reached its backend: counters, charge, the seat's use."""
        run = self.running.pop(rid, None)
        if run is None:
            return None
        self._idle_floor = -math.inf  # its seat may be idle again without a new last_active
        team = self.team(run.waiter.req.team, now)
        team.inflight -= 1
        team.charge(-run.charged)
        seat = self.seats.get(run.waiter.key)
        if seat is not None and seat.slot == run.slot:
            seat.busy -= 1
        self.router.finished(rid, run.slot[0], Outcome(ok=False, reached_backend=False), now)
        return run

    def tick(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for w in list(self.waiting.values()):
            team = self.team(w.req.team, now)
            if now - w.arrived > team.limits.queue_timeout_s:
                del self.waiting[w.req.rid]
                team.waiting -= 1
                decisions.append(
                    Refuse(
                        w.req.rid,
                        "queue_timeout",
                        f"waited {now - w.arrived:.0f} s in team '{w.req.team}' queue "
                        f"(limit {team.limits.queue_timeout_s:g} s)",
                        team.retry_after(team.waiting),
                    )
                )
        if decisions:
            self._idle_floor = -math.inf  # refused waiters' seats are idle now, with an older last_active
        self._expire_anchors(now)
        # Skip the scan while even the longest-idle seat is under the lowest threshold (exact: same releases).
        if now - self._idle_floor > min(self.params.idle_release_s, self.params.full_idle_release_s):
            queued = {w.key for w in self.waiting.values()}
            floor = now
            for seat in list(self.seats.values()):
                if seat.busy == 0 and seat.key not in queued:
                    if now - seat.last_active > self._idle_release_s(seat):
                        self._release(seat)
                    elif seat.last_active < floor:
                        floor = seat.last_active
            self._idle_floor = floor
        return decisions + self._schedule(now)

    # ----- state queries (admin API, metrics, tests) --------------------------------------------

    def snapshot(self) -> dict[str, object]:
        return snapshot_of(self.teams, self.seats, self.reserved, self.waiting, len(self.running), self._clock)

    # ----- internals -----------------------------------------------------------------------------

    def _reserve(self, seat: Seat, tokens: int) -> int:
        self.reserved[seat.slot] = self.reserved.get(seat.slot, 0) - seat.tokens + tokens
        return tokens

    def _dispatch(
        self,
        w: Waiter,
        slot: Slot,
        now: float,
        reason: str,
        scores: dict[str, float] | None = None,
        matched_tokens: int | None = None,
        lent: bool = False,
    ) -> Dispatch:
        req = w.req
        team = self.teams.get(req.team) or self.team(req.team, now)  # self.team(...), mostly without a call
        seat = self.seats.get(w.key)
        if seat is None or seat.slot != slot:
            if seat is not None:
                self._release(seat)
            seat = Seat(w.key, req.model, slot, req.team, 0, now, now, one_shot=w.one_shot or lent)
            self.seats[w.key] = seat
            self.seat_counts[slot] = self.seat_counts.get(slot, 0) + 1
        held, need = seat.tokens, w.need  # self._reserve(seat, max(held, need)), without the calls:
        tokens = seat.tokens = need if need > held else held
        fp = req.fingerprint
        if self.params.shared_blocks and (fp or seat.fp):
            tokens -= self._hold_blocks(seat, fp)
        self.reserved[slot] = self.reserved.get(slot, 0) - held + tokens
        seat.busy += 1
        seat.last_active = now
        if fp and not req.conversation:
            self._anchor(seat, fp)
        p = self.params
        charged = p.input_weight * req.prompt_tokens + p.output_weight * (w.need - req.prompt_tokens)
        team.charge(charged)
        team.inflight += 1
        team.dispatched(now)
        self.running[req.rid] = Running(w, slot, charged, lent)
        decision = new_dispatch(req.rid, slot[0], slot[1], reason, scores or {}, matched_tokens)
        self.router.dispatched(req, decision, now)
        return decision

    def _schedule(self, now: float) -> list[Decision]:
        self._clock = now  # the latest time an event brought, for ``snapshot``
        decisions: list[Decision] = []
        if not self.waiting:
            return decisions
        self._set_kv_factor(now)
        # 1. Turns of seated conversations: they take no new capacity.
        waiters = list(self.waiting.values())
        for w in self._order(waiters) if len(waiters) > 1 else waiters:
            req = w.req
            seat = self.seats.get(w.key)
            if seat is None or seat.model != req.model or seat.slot[0] in req.exclude:
                continue
            if not self._may_dispatch(self.teams[req.team], now):
                continue
            slot = seat.slot
            if self._seats_on(slot) > self._seat_limit(slot) and self._over_limit(seat):
                self._release(seat)  # its rank's seat count fell under its seats: it waits as a new one
                continue
            grow = w.need - seat.tokens
            if grow > 0:
                cap = self._capacity(slot)
                used = self.reserved.get(slot, 0)
                if (
                    used + grow > self._budget(cap, growth=True)
                    and not self._make_room(w, now, slot, grow)
                    and used + grow > (cap * self.share * self._kv_factor if cap else float("inf"))
                    and now - w.arrived < self._patience(w, slot, grow)
                ):
                    continue  # keeps its seat; goes when an idle seat there is released, or at its patience
            self._take(w)
            scores = {"seated": 1.0}
            matched = self.router.matched_tokens(req, slot[0], slot[1])
            if matched is not None:  # for traces: how much of this turn the backend should hold
                scores["matched_tokens"] = float(matched)
            decisions.append(self._dispatch(w, slot, now, "prefix", scores, matched))
        if self.waiting:
            self._seat_new(now, decisions)
        return decisions

    def _seat_new(self, now: float, decisions: list[Decision]) -> None:
        """2. New seats, in fair order; a head that does not fit keeps the slot it waits for, and
        others backfill the model's other slots (policies/request_limits.py). Each waiter is tried
        once, in ``_rank`` order, ranked again after a dispatch (it charges a team); one passed over
        stays so (need not below its model's smallest failed, or its team at its cap: both only tighten)."""
        held: dict[str, Slot | None] = {}  # model -> the blocked head's slot
        smallest_failed: dict[str, int] = {}  # model -> smallest need that found no slot behind the head
        order = self._order_now(list(self.waiting.values()), now)
        while order:
            w = order.pop(0)
            overdue = self._overdue(w, now)
            if (w.need >= smallest_failed.get(w.req.model, 1 << 62) and not overdue) or not self._may_dispatch(
                self.teams[w.req.team], now
            ):
                continue
            head = w.req.model not in held
            place = self._place(w, now, avoid=None if overdue else held.get(w.req.model))
            if place is None and (head or overdue) and self._make_room(w, now):
                place = self._place(w, now)
            lent = place is None and (place := self._lend(w, now)) is not None
            if place is None and now - w.arrived >= self._last_call(w):
                place = self._overbook(w, now)
            if place is None:
                if head:
                    held[w.req.model] = self._head_slot(w)
                else:
                    smallest_failed[w.req.model] = min(w.need, smallest_failed.get(w.req.model, 1 << 62))
                continue
            self._take(w)
            decisions.append(self._dispatch(w, place.slot, now, place.reason, place.scores, place.matched_tokens, lent))
            order = self._order_now(order, now)  # its team's counter moved

    def _make_room(self, w: Waiter, now: float, slot: Slot | None = None, extra: int | None = None) -> bool:
        """Release idle seats so that ``w`` fits (``FairOrder._victims``); False if none may go."""
        victims = self._victims(w, now, slot, extra)
        if victims is None:
            return False
        for seat in victims:
            self._release(seat)
        return True
