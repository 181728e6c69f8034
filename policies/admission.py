"""Cache-protecting admission: team limits, a fair queue, and seats on backends.

``SeatedAdmission`` is the decision core of the ``gateway`` stack (interfaces §2). It decides
*when* a request may go; its router decides *where* a conversation sits.

Seats
-----
A conversation admitted to a backend (a DP rank of it) holds a **seat** there. The seat reserves
the conversation's KV: ``need = prompt_tokens + min(max_output_tokens or default_output, output_clip)``,
kept through the think pause between turns, so the conversation's next turn goes straight through
and finds its prefix still cached. A backend (rank) with capacity ``C`` (``max_total_num_tokens``)
grants a new seat only while ``Σ seats + need ≤ admit_water · C``. Seated conversations grow turn
by turn into the gap up to ``high_water · C``; a turn that would pass it first releases idle seats
there (held at least ``min_hold_s``); if none may go it still goes while the pool is not full, and
waits otherwise. The gap between the two marks is
what lets conversations grow without a swap on every turn: most seats end with their conversation.
So the running conversations' working set never outgrows the engine's cache, and the excess waits
at the gateway instead of thrashing the engine.

A seat is given up when
- its conversation has been idle ``idle_release_s`` (it ended, or its user went away);
- a conversation waiting for a seat that does not fit has waited ``quantum_s``, and the seat is idle
  (between turns) and has been held ``min_hold_s`` (``rotate_on="waiter"``, the default: waits are
  bounded by about the quantum, and when conversations end fast enough to seat the waiters no seat is
  ever swapped; ``rotate_on="seat"`` instead rotates any seat held ``quantum_s`` while others wait);
- others wait in a higher priority band, or from a team served less than the seat's team, and the
  seat has been held ``min_hold_s`` (fairness must not wait a whole quantum).
A swap-in costs a full recompute of the context, so the quantum trades throughput against waiting.
Victims are chosen per backend so that the fewest seats are released, most-served team first,
then oldest seat.

Order of the waiting room
-------------------------
Turns of seated conversations go first (they take no new capacity), then new seats: priority band
(higher first), then the team's virtual token counter (lowest first: ``policies/teams.py``), then
arrival. A new-seat request that does not fit keeps the slot where it is shortest of room: new
seats behind it may go only to the model's other slots (backfill that cannot delay it, so large
conversations are not starved by small ones; with one slot, nothing passes it). A request that can
never fit is refused on arrival (``policies/request_limits.py``). Team caps (``max_concurrency``)
skip a team without blocking others.

Parameters and defaults: ``admit_water`` 0.85, ``high_water`` 0.95, ``quantum_s`` 900,
``rotate_on`` "waiter", ``min_hold_s`` 20, ``idle_release_s`` 30, ``default_output`` 1024,
``output_clip`` 4096 (SGLang's own clip), ``input_weight`` 1 and ``output_weight`` 1 (tokens
charged to a team's counter per token served).
Figures behind these choices: docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from policies.request_limits import can_hold, head_slot, never_runs
from policies.routing import Router
from policies.teams import UNLIMITED, TeamLimits, TeamState
from policies.types import BackendView, Decision, Dispatch, Outcome, Refuse, RequestFacts

Slot = tuple[str, int | None]
"""(backend name, DP rank or None for a backend without DP attention)."""


@dataclass(frozen=True, slots=True)
class SeatParams:
    high_water: float = 0.95
    admit_water: float = 0.85
    quantum_s: float = 900.0
    min_hold_s: float = 20.0
    rotate_on: str = "waiter"
    """What makes an idle seat revocable for a waiter: "waiter" (the waiter has waited ``quantum_s``;
    the seat was held ``min_hold_s``) or "seat" (the seat was held ``quantum_s``)."""
    idle_release_s: float = 30.0
    default_output: int = 1024
    output_clip: int = 4096
    input_weight: float = 1.0
    output_weight: float = 1.0


@dataclass(slots=True)
class Seat:
    key: str
    model: str
    slot: Slot
    team: str
    tokens: int
    since: float
    last_active: float
    busy: int = 0
    anchor: int | None = None
    one_shot: bool = False


@dataclass(slots=True)
class Waiter:
    req: RequestFacts
    key: str
    need: int
    arrived: float
    seq: int
    one_shot: bool


@dataclass(slots=True)
class Running:
    waiter: Waiter
    slot: Slot
    charged: float


@dataclass(frozen=True, slots=True)
class Placement:
    slot: Slot
    reason: str
    scores: dict[str, float]


@dataclass(slots=True)
class _Model:
    views: dict[str, BackendView] = field(default_factory=dict)


class SeatedAdmission:
    """The ``gateway`` decision core: team limits, fair queue, seats (see the module docstring)."""

    def __init__(self, router: Router, teams: Mapping[str, TeamLimits] | None = None,
                 default_team: TeamLimits = UNLIMITED, params: SeatParams | None = None,
                 name: str = "gateway") -> None:
        self.name = name
        self.router = router
        self.params = params or SeatParams()
        self.limits: dict[str, TeamLimits] = dict(teams or {})
        self.default_team = default_team
        self.teams: dict[str, TeamState] = {}
        self.models: dict[str, _Model] = {}
        self.seats: dict[str, Seat] = {}
        self.reserved: dict[Slot, int] = {}
        self.anchors: dict[int, str] = {}
        self.waiting: dict[str, Waiter] = {}
        self.running: dict[str, Running] = {}
        self._seq = itertools.count()
        self.share = 1.0
        self.split_concurrency = False

    # ----- configuration -------------------------------------------------------------------------

    def configure(self, config: Mapping[str, object]) -> None:
        """Take team limits and seat parameters from a config mapping (interfaces §6 shape):
        ``teams: {name: {max_concurrency, ...}}`` (the ``default`` entry applies to teams not listed)
        and ``admission: {high_water, admit_water, quantum_s, ...}``."""
        teams = config.get("teams") or {}
        assert isinstance(teams, Mapping)
        for name, fields in teams.items():
            limits = TeamLimits(**{k: v for k, v in dict(fields or {}).items() if v is not None})
            if name == "default":
                self.default_team = limits
            self.set_team(str(name), limits)
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
        """This replica's share of every limit when several replicas share the backends (interfaces §5).

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

    def _cap(self, team: TeamState) -> int:
        limit = team.limits.max_concurrency
        if not self.split_concurrency or limit <= 0 or self.share >= 1.0:
            return limit
        return max(1, math.ceil(limit * self.share))

    def _may_dispatch(self, team: TeamState, now: float) -> bool:
        return team.inflight < self._cap(team) and team.blocked_until <= now

    def team(self, name: str, now: float) -> TeamState:
        state = self.teams.get(name)
        if state is None:
            state = self.teams[name] = TeamState(name, self.limits.get(name, self.default_team), now)
        return state

    # ----- events --------------------------------------------------------------------------------

    def set_backends(self, model: str, backends: Sequence[BackendView], now: float) -> list[Decision]:
        entry = self.models.setdefault(model, _Model())
        entry.views = {b.name: b for b in backends}
        for seat in list(self.seats.values()):
            if seat.model == model:
                view = entry.views.get(seat.slot[0])
                if view is None or not view.healthy:
                    self._release(seat)
        return self._schedule(now)

    def arrive(self, req: RequestFacts, now: float) -> list[Decision]:
        team = self.team(req.team, now)
        if not self._healthy(req.model, req.exclude):
            return [Refuse(req.rid, "no_healthy_backend", f"no healthy backend for model '{req.model}'", 5.0, 503)]
        never = never_runs(req, self.models[req.model].views.values(), self.params.high_water, team.limits)
        if never is not None:  # it would block the seat queue until its timeout: refuse it now
            return [never]
        queue_cap = team.limits.max_queue if self.share >= 1.0 else math.ceil(team.limits.max_queue * self.share)
        if team.waiting >= queue_cap:
            return [Refuse(req.rid, "team_queue_full",
                           f"team '{req.team}' has {team.waiting} requests waiting (limit {queue_cap})",
                           team.retry_after(team.waiting))]
        need = self._need(req)
        wait = team.take_tokens(need, now, self.share)
        if wait > 0:
            return [Refuse(req.rid, "team_token_rate",
                           f"team '{req.team}' is over its {team.limits.tokens_per_minute} tokens per minute",
                           wait)]
        key, one_shot = self._conversation(req)
        if not team.active:
            active = [t.vtc for t in self.teams.values() if t.active]
            if active:
                team.vtc = max(team.vtc, min(active))
        self.waiting[req.rid] = Waiter(req, key, need, now, next(self._seq), one_shot)
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
        team = self.team(w.req.team, now)
        team.inflight -= 1
        if outcome.prompt_tokens or outcome.completion_tokens:
            actual = (self.params.input_weight * outcome.prompt_tokens
                      + self.params.output_weight * outcome.completion_tokens)
            team.charge(actual - run.charged)
        seat = self.seats.get(w.key)
        if seat is not None and seat.slot == run.slot:
            seat.busy -= 1
            seat.last_active = now
            if outcome.prompt_tokens and outcome.completion_tokens:
                seat.tokens = self._reserve(seat, outcome.prompt_tokens + outcome.completion_tokens)
            if seat.one_shot or ((not outcome.reached_backend or outcome.refused) and seat.busy == 0):
                self._release(seat)
        self.router.finished(rid, run.slot[0], outcome, now)
        return self._schedule(now)

    def cancel(self, rid: str, now: float) -> list[Decision]:
        waiter = self.waiting.pop(rid, None)
        if waiter is not None:
            self.team(waiter.req.team, now).waiting -= 1
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
        retried = Waiter(_with_exclude(w.req, failed_backend), w.key, w.need, w.arrived, w.seq, w.one_shot)
        place = self._place(retried, now)
        if place is None:
            return [Refuse(rid, "no_healthy_backend", "no other backend can take this request now", 5.0, 503)]
        return [self._dispatch(retried, place.slot, now, "retry", place.scores)]

    def _undo(self, rid: str, now: float) -> Running | None:
        """Take back a dispatch that never reached its backend: counters, charge, the seat's use."""
        run = self.running.pop(rid, None)
        if run is None:
            return None
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
                decisions.append(Refuse(w.req.rid, "queue_timeout",
                                        f"waited {now - w.arrived:.0f} s in team '{w.req.team}' queue "
                                        f"(limit {team.limits.queue_timeout_s:g} s)", team.retry_after(team.waiting)))
        queued = {w.key for w in self.waiting.values()}
        for seat in list(self.seats.values()):
            if seat.busy == 0 and seat.key not in queued and now - seat.last_active > self.params.idle_release_s:
                self._release(seat)
        return decisions + self._schedule(now)

    # ----- state queries (admin API, metrics, tests) --------------------------------------------

    def snapshot(self) -> dict[str, object]:
        return {
            "teams": {n: {"inflight": t.inflight, "waiting": t.waiting, "vtc": round(t.vtc, 1)}
                      for n, t in self.teams.items()},
            "backends": {f"{b}" if r is None else f"{b}#{r}": {"reserved_tokens": tokens,
                                                              "seats": sum(1 for s in self.seats.values()
                                                                           if s.slot == (b, r))}
                         for (b, r), tokens in self.reserved.items()},
            "waiting": len(self.waiting),
            "running": len(self.running),
        }

    # ----- internals -----------------------------------------------------------------------------

    def _need(self, req: RequestFacts) -> int:
        out = min(req.max_output_tokens or self.params.default_output, self.params.output_clip)
        return req.prompt_tokens + out

    def _conversation(self, req: RequestFacts) -> tuple[str, bool]:
        """The conversation a request continues: given by the caller, or found by the anchor (the last
        full block of a seated conversation's previous prompt) that this prompt extends. A match counts
        only if what follows the anchor is no longer than what precedes it: a turn adds one answer and
        one tool result to its history, while an anchor inside a shared system prompt would be followed
        by a whole other conversation."""
        if req.conversation:
            return req.conversation, False
        total = sum(n for _, n in req.fingerprint)
        after = 0
        for key, tokens in reversed(req.fingerprint):
            conv = self.anchors.get(key)
            if conv is not None and after <= total - after:
                return conv, False
            after += tokens
            if after > total - after:
                break
        return f"rid:{req.rid}", not req.fingerprint

    def _healthy(self, model: str, exclude: frozenset[str] = frozenset()) -> bool:
        entry = self.models.get(model)
        return entry is not None and any(v.healthy and v.name not in exclude for v in entry.views.values())

    def _slots(self, model: str, exclude: frozenset[str]) -> list[tuple[Slot, int]]:
        """Every healthy (backend, rank) of ``model`` with its capacity (0: unknown, unbounded)."""
        entry = self.models.get(model)
        if entry is None:
            return []
        slots: list[tuple[Slot, int]] = []
        for view in entry.views.values():
            if not view.healthy or view.name in exclude:
                continue
            if view.dp_size > 1:
                slots += [((view.name, r), view.kv_tokens) for r in range(view.dp_size)]
            else:
                slots.append(((view.name, None), view.kv_tokens))
        return slots

    def _capacity(self, slot: Slot) -> int:
        for candidate, cap in self._slots_all(slot[0]):
            if candidate == slot:
                return cap
        return 0

    def _slots_all(self, backend: str) -> list[tuple[Slot, int]]:
        for entry in self.models.values():
            view = entry.views.get(backend)
            if view is not None:
                if view.dp_size > 1:
                    return [((backend, r), view.kv_tokens) for r in range(view.dp_size)]
                return [((backend, None), view.kv_tokens)]
        return []

    def _budget(self, capacity: int, growth: bool = False) -> float:
        water = self.params.high_water if growth else self.params.admit_water
        return water * capacity * self.share if capacity else float("inf")

    def _fits(self, need: int, slot: Slot, capacity: int) -> bool:
        budget = self._budget(capacity)
        used = self.reserved.get(slot, 0)
        # A conversation larger than the whole budget still gets an empty backend to itself.
        return used + min(need, budget) <= budget

    def _head_slot(self, w: Waiter) -> Slot | None:
        return head_slot(self._slots(w.req.model, w.req.exclude), w.need, lambda s: self.reserved.get(s, 0),
                         self._budget)

    def _place(self, w: Waiter, now: float, avoid: Slot | None = None) -> Placement | None:
        """A slot with room for a new seat (not ``avoid``: a blocked head's), chosen by the router."""
        fitting = {slot for slot, cap in self._slots(w.req.model, w.req.exclude)
                   if slot != avoid and self._fits(w.need, slot, cap)
                   and can_hold(w.req.prompt_tokens, cap, self.params.high_water)}
        if not fitting:
            return None
        entry = self.models[w.req.model]
        names = {slot[0] for slot in fitting}
        choice = self.router.route(w.req, [v for n, v in entry.views.items() if n in names], now)
        if choice is not None:
            slot = (choice.backend, choice.rank if entry.views[choice.backend].dp_size > 1 else None)
            if slot in fitting:
                return Placement(slot, choice.reason, choice.scores)
            same = [s for s in fitting if s[0] == choice.backend]
            if same:  # the router's backend, on a rank that has room
                return Placement(min(same, key=lambda s: self.reserved.get(s, 0)), choice.reason, choice.scores)
        slot = min(fitting, key=lambda s: (self.reserved.get(s, 0), s[0], s[1] or 0))
        return Placement(slot, "least_wait", {})

    def _reserve(self, seat: Seat, tokens: int) -> int:
        self.reserved[seat.slot] = self.reserved.get(seat.slot, 0) - seat.tokens + tokens
        return tokens

    def _dispatch(self, w: Waiter, slot: Slot, now: float, reason: str, scores: dict[str, float] | None = None
                  ) -> Dispatch:
        team = self.team(w.req.team, now)
        seat = self.seats.get(w.key)
        if seat is None or seat.slot != slot:
            if seat is not None:
                self._release(seat)
            seat = Seat(w.key, w.req.model, slot, w.req.team, 0, now, now, one_shot=w.one_shot)
            self.seats[w.key] = seat
        seat.tokens = self._reserve(seat, max(seat.tokens, w.need))
        seat.busy += 1
        seat.last_active = now
        if len(w.req.fingerprint) > 0 and not w.req.conversation:
            anchor = w.req.fingerprint[-2 if len(w.req.fingerprint) > 1 else -1][0]
            if seat.anchor is not None:
                self.anchors.pop(seat.anchor, None)
            seat.anchor = anchor
            self.anchors[anchor] = w.key
        charged = (self.params.input_weight * w.req.prompt_tokens
                   + self.params.output_weight * (w.need - w.req.prompt_tokens))
        team.charge(charged)
        team.inflight += 1
        team.dispatched(now)
        self.running[w.req.rid] = Running(w, slot, charged)
        decision = Dispatch(w.req.rid, slot[0], slot[1], reason, scores or {})
        self.router.dispatched(w.req, decision, now)
        return decision

    def _release(self, seat: Seat) -> None:
        if self.seats.get(seat.key) is seat:
            del self.seats[seat.key]
        self.reserved[seat.slot] = self.reserved.get(seat.slot, 0) - seat.tokens
        if seat.anchor is not None and self.anchors.get(seat.anchor) == seat.key:
            del self.anchors[seat.anchor]

    def _band(self, w: Waiter) -> int:
        return self.teams[w.req.team].limits.priority + w.req.priority

    def _rank(self, w: Waiter) -> tuple[int, float, float, int]:
        return (-self._band(w), self.teams[w.req.team].vtc, w.arrived, w.seq)

    def _order(self, waiters: list[Waiter]) -> list[Waiter]:
        return sorted(waiters, key=self._rank)

    def _schedule(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        # 1. Turns of seated conversations: they take no new capacity.
        for w in self._order(list(self.waiting.values())):
            seat = self.seats.get(w.key)
            team = self.teams[w.req.team]
            if seat is None or seat.model != w.req.model or seat.slot[0] in w.req.exclude:
                continue
            if not self._may_dispatch(team, now):
                continue
            grow = w.need - seat.tokens
            cap = self._capacity(seat.slot)
            used = self.reserved.get(seat.slot, 0)
            if (grow > 0 and used + grow > self._budget(cap, growth=True)
                    and not self._make_room(w, now, seat.slot, grow)
                    and used + grow > (cap * self.share if cap else float("inf"))):
                continue  # keeps its seat; goes when an idle seat there can be released
            self._take(w)
            scores = {"seated": 1.0}
            matched = getattr(self.router, "matched_tokens", None)
            if matched is not None:  # for traces: how much of this turn the backend should hold
                scores["matched_tokens"] = float(matched(w.req, *seat.slot))
            decisions.append(self._dispatch(w, seat.slot, now, "prefix", scores))
        # 2. New seats, in fair order; a head that does not fit keeps the slot it waits for, and
        # others backfill the model's other slots (policies/request_limits.py).
        held: dict[str, Slot | None] = {}  # model -> the blocked head's slot
        tried: set[str] = set()
        smallest_failed: dict[str, int] = {}
        while True:
            candidates = [w for w in self.waiting.values()
                          if w.req.rid not in tried and w.need < smallest_failed.get(w.req.model, 1 << 62)
                          and self._may_dispatch(self.teams[w.req.team], now)]
            if not candidates:
                break
            w = min(candidates, key=self._rank)
            tried.add(w.req.rid)
            head = w.req.model not in held
            place = self._place(w, now, avoid=held.get(w.req.model))
            if place is None and head and self._make_room(w, now):
                place = self._place(w, now)
            if place is None:
                if head:
                    held[w.req.model] = self._head_slot(w)
                else:
                    smallest_failed[w.req.model] = min(w.need, smallest_failed.get(w.req.model, 1 << 62))
                continue
            self._take(w)
            decisions.append(self._dispatch(w, place.slot, now, place.reason, place.scores))
        return decisions

    def _take(self, w: Waiter) -> None:
        del self.waiting[w.req.rid]
        self.teams[w.req.team].waiting -= 1

    def _make_room(self, w: Waiter, now: float, slot: Slot | None = None, extra: int | None = None) -> bool:
        """Release idle seats so that ``w`` fits: on ``slot`` for ``extra`` more tokens (a seated
        conversation that grew), else on whichever backend needs the fewest released; False if none may go."""
        p = self.params
        team = self.teams[w.req.team]
        best: tuple[int, list[Seat]] | None = None
        queued = {other.key for other in self.waiting.values()}
        slots = [(s, c) for s, c in self._slots(w.req.model, w.req.exclude) if slot is None or s == slot]
        for candidate, cap in slots:
            need = w.need if extra is None else extra
            victims = []
            for seat in self.seats.values():
                if seat.slot != candidate or seat.busy or seat.key == w.key or seat.key in queued:
                    continue
                held = now - seat.since
                owner = self.teams[seat.team]
                favoured = extra is not None or owner.vtc > team.vtc or self._band(w) > owner.limits.priority
                if p.rotate_on == "waiter":
                    favoured = favoured or now - w.arrived >= p.quantum_s
                if (p.rotate_on == "seat" and held >= p.quantum_s) or (favoured and held >= p.min_hold_s):
                    victims.append(seat)
            victims.sort(key=lambda s: (-self.teams[s.team].vtc, s.since))
            budget = self._budget(cap, growth=extra is not None)
            used = self.reserved.get(candidate, 0)
            chosen: list[Seat] = []
            for seat in victims:
                if used + min(need, budget) <= budget:
                    break
                used -= seat.tokens
                chosen.append(seat)
            if used + min(need, budget) <= budget and chosen and (best is None or len(chosen) < best[0]):
                best = (len(chosen), chosen)
        if best is None:
            return False
        for seat in best[1]:
            self._release(seat)
        return True


def _with_exclude(req: RequestFacts, backend: str) -> RequestFacts:
    fields = {name: getattr(req, name) for name in req.__slots__}
    fields["exclude"] = req.exclude | {backend}
    return RequestFacts(**fields)
