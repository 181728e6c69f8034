"""What the routers share: cache slots (backend, DP rank), in-flight counting, stable hashing.

A backend declared with ``dp_size`` N > 1 is N slots ``(name, 0..N-1)``: each DP rank has its own KV
pool and radix tree, so the routers index, count and choose per rank and say which one in
``Dispatch.rank``. A backend without DP is one slot ``(name, None)`` (and needs no ``routed_dp_rank``).
``Slot`` is defined once, in ``policies/types.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from policies.types import BackendView, Dispatch, Slot, new_dispatch

_MASK = (1 << 64) - 1


def slots_of(backends: Iterable[BackendView]) -> list[tuple[Slot, BackendView]]:
    """Every (backend, rank) pair, in the order the backends were given."""
    return [((b.name, r if b.dp_size > 1 else None), b) for b in backends for r in range(max(1, b.dp_size))]


def slot_of(decision: Dispatch) -> Slot:
    return (decision.backend, decision.rank)


def make_dispatch(
    rid: str, slot: Slot, reason: str, scores: dict[str, float] | None = None, matched_tokens: int | None = None
) -> Dispatch:
    """The decision for ``slot`` (its rank is None for a backend without DP)."""
    return new_dispatch(rid, slot[0], slot[1], reason, scores or {}, matched_tokens)


def slot_label(slot: Slot) -> str:
    """``backend@rank``; ``backend@0`` without DP (the label rendezvous hashes: changing it would move
    every cold conversation to another backend)."""
    return f"{slot[0]}@{slot[1] or 0}"


def stable_hash(text: str) -> int:
    """A 64-bit hash that is the same in every process (``hash()`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def mix64(x: int) -> int:
    """SplitMix64's finaliser: a cheap, well-spread 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class Rendezvous:
    """Highest-random-weight order of slots for a key, identical in every process."""

    def __init__(self) -> None:
        self._ids: dict[Slot, int] = {}

    def _id(self, slot: Slot) -> int:
        sid = self._ids.get(slot)
        if sid is None:
            sid = self._ids[slot] = stable_hash(slot_label(slot))
        return sid

    def order(self, key: int, slots: Sequence[Slot]) -> list[Slot]:
        return sorted(slots, key=lambda s: mix64(key ^ self._id(s)), reverse=True)


class Inflight:
    """Requests this router dispatched and has not seen finish, counted per slot and per backend."""

    def __init__(self) -> None:
        self.slot_of: dict[str, Slot] = {}
        self.per_slot: dict[Slot, int] = {}
        self.per_backend: dict[str, int] = {}

    def add(self, rid: str, slot: Slot) -> None:
        if rid in self.slot_of:
            self.remove(rid)
        self.slot_of[rid] = slot
        self.per_slot[slot] = self.per_slot.get(slot, 0) + 1
        self.per_backend[slot[0]] = self.per_backend.get(slot[0], 0) + 1

    def remove(self, rid: str) -> Slot | None:
        slot = self.slot_of.pop(rid, None)
        if slot is not None:
            self.per_slot[slot] -= 1
            self.per_backend[slot[0]] -= 1
        return slot

    def count(self, slot: Slot) -> int:
        return self.per_slot.get(slot, 0)
