"""The estimators ``min-ttft`` (``policies/routers/min_ttft.py``) decides with: prefill time, the
prefix every request shares, each rank's recent working set, and a recent maximum. Pure, time
passed in; each class gives its formula, parameters and defaults."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import pairwise
from operator import itemgetter

from policies.types import Fingerprint, Slot

_KEY = itemgetter(0)
"""A fingerprint block's key."""


@dataclass(frozen=True, slots=True)
class PrefillModel:
    """Prefill seconds of ``u`` uncached tokens after ``c`` cached ones: ``t0 + u / rate + k_attn · u ·
    (c + u/2)`` (a fixed cost per pass, the linear layers, causal attention over the context; the
    simulated engine's prefill in ``backends/sim/profiles.py`` has the same shape). Defaults: a prior
    for Kimi on 8×B300 TP8 (t0 30 ms, 40k tok/s, k_attn 6.25e-10 s per token·context: a 160k-token
    recompute ≈ 12 s, a 3k-token turn ≈ 0.4 s); ``min-ttft`` scales it by each backend's learned speed,
    so the prior need not match a deployment (nor the simulator's profiles) exactly."""

    t0: float = 0.03
    rate: float = 40_000.0
    k_attn: float = 6.25e-10

    def seconds(self, uncached: int, cached: int) -> float:
        u = uncached if uncached > 0 else 0  # max(0, uncached) without the call (max's own comparison)
        return self.t0 + u / self.rate + self.k_attn * u * (cached + u / 2)


class CommonBlocks:
    """Blocks that many conversations share (a system prompt, tool definitions).

    A block is common iff it is a *branch point* (two different blocks have been seen right after
    it, in the first ``scan_blocks`` blocks of dispatched requests) and it is among the first
    ``scan_blocks`` blocks of at least ``frac`` of the last ``window`` requests. A request's common
    prefix runs up to and including its deepest common block. Such a prefix says nothing about
    which conversation a request belongs to, so the router skips it when it looks for a match and
    for the rendezvous key. A conversation's own history is one chain (each block has one
    successor), so it stays distinctive however few conversations run; a prefix that only some
    requests share (a popular document) stays distinctive too, and pulls its requests to where it
    is cached; a system prompt becomes common as soon as a second conversation uses it (the request
    being routed counts as the second successor: its own next block differs from the one seen, unless
    the one seen was the last block of its prompt, which the next turn of a conversation fills).
    Memory: the successor of at most ``max_blocks`` blocks (LRU), as many prompts' last blocks, and the
    window's counts.
    Defaults: ``scan_blocks`` 256, ``frac`` 0.25 (up to four system prompts), ``window`` 512,
    ``max_blocks`` 262,144.
    """

    _BRANCH = -1

    def __init__(
        self, *, scan_blocks: int = 256, frac: float = 0.25, window: int = 512, max_blocks: int = 262_144
    ) -> None:
        self.scan_blocks = scan_blocks
        self.frac = frac
        self.window = window
        self.max_blocks = max_blocks
        self._next: OrderedDict[int, int] = OrderedDict()
        self._recent: deque[tuple[int, ...]] = deque()
        self._counts: dict[int, int] = {}
        self._tails: OrderedDict[int, None] = OrderedDict()
        """The last scanned block of recent prompts (at most ``max_blocks``, LRU)."""
        self._last: tuple[Fingerprint, int, float, int] | None = None
        """The last ``prefix_blocks`` answer (fingerprint, scan_blocks, frac, depth): the same prompt
        asks again (every turn of a short repeated request; ``route`` then ``dispatched``), and the answer
        holds until ``observe`` changes a successor, a count or the window's length."""

    def prefix_blocks(self, fp: Fingerprint) -> int:
        """How many leading blocks of ``fp`` are common (1 + the index of its deepest common block)."""
        last = self._last
        if (
            last is not None
            and (last[0] is fp or last[0] == fp)  # ``is`` first: == walks every block even of the same tuple
            and last[1] == self.scan_blocks
            and last[2] == self.frac
        ):
            return last[3]
        nxt, counts, branch = self._next, self._counts, self._BRANCH
        threshold = self.frac * len(self._recent)
        depth = 0
        scanned = fp[: self.scan_blocks]
        final = len(scanned) - 1
        for i, (key, _) in enumerate(scanned):
            c = counts.get(key, 0)
            if c == 0 or c < threshold:
                break
            seen = nxt.get(key)
            # this request brings the second successor itself: the first reuse of a system prompt is
            # already a reuse (else it pulls the second conversation to the first one's slot); not where
            # the successor seen ended its prompt (a conversation's next turn fills its last block)
            if seen == branch or (
                seen is not None and i < final and seen != scanned[i + 1][0] and seen not in self._tails
            ):
                depth = i + 1
        self._last = (fp, self.scan_blocks, self.frac, depth)
        return depth

    def observe(self, fp: Fingerprint) -> None:
        nxt, counts, branch = self._next, self._counts, self._BRANCH
        keys = tuple(map(_KEY, fp[: self.scan_blocks]))
        changed = False  # a successor, a count or the window's length (what prefix_blocks reads)
        if len(keys) > 1:  # else no block has a successor here (a short prompt: skip the set-up)
            get, move = nxt.get, nxt.move_to_end
            for key, succ in pairwise(keys):
                seen = get(key)
                if seen is None:
                    nxt[key] = succ
                    changed = True
                else:
                    if seen != succ and seen != branch:
                        nxt[key] = branch
                        changed = True
                    move(key)
        while len(nxt) > self.max_blocks:
            nxt.popitem(last=False)
            changed = True
        if keys:
            tails = self._tails
            if keys[-1] not in tails:
                tails[keys[-1]] = None
                changed = True
                if len(tails) > self.max_blocks:
                    tails.popitem(last=False)
            else:
                tails.move_to_end(keys[-1])
        recent = self._recent
        if recent and len(recent) >= self.window and recent[0] == keys:
            # The same blocks leave the window as enter it (a repeated prompt): the counts stay.
            recent.append(keys)
            recent.popleft()
            if changed:
                self._last = None
            return
        self._last = None
        recent.append(keys)
        count = counts.get
        for k in keys:
            counts[k] = count(k, 0) + 1
        if len(recent) > self.window:
            for k in recent.popleft():
                left = counts[k] - 1
                if left:
                    counts[k] = left
                else:
                    del counts[k]


class Footprint:
    """Each slot's recent working set: the latest prompt tokens of every conversation that sent a
    request there within the last ``active_s`` seconds (default 600). A conversation is known by
    its key (its first distinguishing block); when it moves, it leaves its old slot's set."""

    def __init__(self, active_s: float = 600.0) -> None:
        self.active_s = active_s
        self._per_slot: dict[Slot, OrderedDict[int, tuple[float, int]]] = {}
        self._total: dict[Slot, int] = {}
        self._home: dict[int, Slot] = {}

    def touch(self, slot: Slot, key: int, tokens: int, now: float) -> None:
        home = self._home.get(key)
        if home == slot:  # the same slot again: its entry becomes the newest, with these tokens
            recent = self._per_slot[slot]
            old = recent.get(key)
            if old is not None:
                recent.move_to_end(key)
                recent[key] = (now, tokens)
                self._total[slot] = self._total[slot] - old[1] + tokens
                return
        if home is not None:
            old = self._per_slot[home].pop(key, None)
            if old is not None:
                self._total[home] -= old[1]
        self._home[key] = slot
        entries = self._per_slot.get(slot)
        if entries is None:
            entries = self._per_slot[slot] = OrderedDict()
        entries[key] = (now, tokens)
        self._total[slot] = self._total.get(slot, 0) + tokens

    def tokens(self, slot: Slot, now: float) -> int:
        recent = self._per_slot.get(slot)
        if not recent:
            return 0
        horizon = now - self.active_s
        while recent:
            key, (t, n) = next(iter(recent.items()))
            if t >= horizon:
                break
            recent.popitem(last=False)
            self._total[slot] -= n
            if self._home.get(key) == slot:
                del self._home[key]
        return self._total[slot]

    def own(self, key: int) -> tuple[Slot, int] | None:
        """Where conversation ``key`` currently counts, and for how many tokens."""
        home = self._home.get(key)
        if home is None:
            return None
        entry = self._per_slot[home].get(key)
        return None if entry is None else (home, entry[1])


class RecentMax:
    """The largest value a counter had over the last ``window_s`` seconds: what a load report
    taken at some unknown moment of that window may still include."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._points: deque[tuple[float, int]] = deque()
        self.value = 0

    def set(self, value: int, now: float) -> None:
        self.value = value
        points = self._points
        while points and points[-1][1] <= value:  # a smaller older value can never be the max
            points.pop()
        points.append((now, value))

    def max(self, now: float) -> int:
        points = self._points
        horizon = now - self.window_s
        while len(points) > 1 and points[0][0] < horizon:
            points.popleft()
        return max(self.value, points[0][1]) if points else self.value


@dataclass(slots=True)
class SlotState:
    """What ``min-ttft`` (policies/routers/min_ttft.py) counts per (backend, rank)."""

    pending_recent: RecentMax
    inflight_recent: RecentMax
    """Its backend's counters in ``MinTTFT._pending_recent`` / ``_inflight_recent`` (shared by its
    ranks): held here so that each event counts without looking them up."""
    busy_until: float = 0.0
    """When this rank's prefill queue (as this router counted it) should be empty."""
    pending_s: float = 0.0
    pending: set[str] = field(default_factory=set)
    """Requests dispatched here that have no first token yet."""
    inflight: int = 0
    """Requests dispatched here that have not finished (``base.Inflight.count``, kept with the entries)."""
