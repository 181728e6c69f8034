"""The exact cache view: what an engine holds, as its KV events say, and when that can be trusted.

``EngineMirror`` follows one engine cache (a backend, or one DP rank of it) from SGLang's KV events:
``stored`` blocks added, ``removed`` dropped, ``cleared`` emptied. It is *synced* (exact) only while it
has applied every message of the publisher's sequence in order:

- a message whose sequence number is past the next expected one is a gap: unsynced until a replay
  fills it; one below it is a duplicate (also received by a replay), unless it is a new seq 0 (a
  restarted engine's publisher), which resets the mirror;
- the I/O side probes the publisher's replay endpoint every poll from the last applied sequence
  number (``probe_from``): the answer must start with that very message (same payload digest), else
  the publisher is not the one followed (restarted) or lost it; an answer starting at 0 is the whole
  history (rebuilt), an empty answer from a publisher that never published is an empty cache; no
  answer within the timeout is a dead publisher (unsynced);
- an unsynced mirror whose history cannot be replayed waits for ``cleared`` (an engine restart or
  flush) to start again from a known empty cache.

``PreciseIndex`` is a ``PrefixIndex`` (the approximate index, still fed by the router) that answers
from the mirror of every synced slot and from the approximation elsewhere. Fingerprint blocks are
matched to engine blocks by a ``BlockMap`` (fingerprint key → engine block hash): the identity in the
simulator, where the fingerprint is the engine's blocks; learned live from the engine's own
tokenization (``gateway/state/kv_learn.py``). A block with no mapping counts as not held.

Pure: no I/O, no clock (``now`` passed in). Parameters: ``BlockMap(capacity)`` 1,000,000 entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from policies.prefix_index import PrefixIndex
from policies.types import Fingerprint

Event = tuple[str, Sequence[int], int | None]
"""``("stored", hashes, parent)``, ``("removed", hashes, None)`` or ``("cleared", (), None)``."""


@dataclass(slots=True)
class Message:
    seq: int
    digest: bytes
    events: list[Event]


@dataclass
class EngineMirror:
    """One engine cache as its events say. ``synced``: every message applied, in order."""

    blocks: set[int] = field(default_factory=set)
    synced: bool = False
    state: str = "new"
    """new | exact | gap | restarted | dead | unrecoverable (the last reason it left ``exact``)."""
    next_seq: int | None = None
    last_digest: bytes = b""
    first_digest: bytes = b""
    changed_at: float = 0.0
    transitions: int = 0

    def _set(self, synced: bool, state: str, now: float) -> None:
        if synced != self.synced:
            self.transitions += 1
            self.changed_at = now
        self.synced, self.state = synced, state

    def _apply(self, msg: Message) -> None:
        blocks = self.blocks
        for kind, hashes, _ in msg.events:
            if kind == "stored":
                blocks.update(hashes)
            elif kind == "removed":
                blocks.difference_update(hashes)
            else:
                blocks.clear()
        self.next_seq = msg.seq + 1
        self.last_digest = msg.digest
        if msg.seq == 0:
            self.first_digest = msg.digest

    def _reset(self) -> None:
        self.blocks.clear()
        self.next_seq = None
        self.last_digest = b""

    def on_message(self, msg: Message, now: float) -> bool:
        """A live message. Returns True when the mirror needs a replay (a gap or an unknown start)."""
        if self.synced:
            expected = self.next_seq if self.next_seq is not None else 0
            if msg.seq == expected:
                self._apply(msg)
                return False
            if msg.seq < expected:
                if msg.seq == 0 and msg.digest != self.first_digest:  # a new publisher (restarted engine)
                    self._reset()
                    self._apply(msg)
                    return False
                return False  # a duplicate (a message also received by a replay)
            self._set(False, "gap", now)
            return True
        if not self.synced and any(kind == "cleared" for kind, _, _ in msg.events):
            # a known empty cache: what follows the last clear in this message is the whole truth
            last = max(i for i, (kind, _, _) in enumerate(msg.events) if kind == "cleared")
            self._reset()
            self._apply(Message(msg.seq, msg.digest, msg.events[last:]))
            self._set(True, "exact", now)
            return False
        if not self.synced and self.next_seq is None and msg.seq == 0:
            self._apply(msg)
            self._set(True, "exact", now)
            return False
        return not self.synced

    def probe_from(self) -> int:
        """Where the next replay request starts: the last applied message (a continuity check)."""
        return max(0, (self.next_seq or 0) - 1) if self.next_seq is not None else 0

    def on_replay(self, messages: Sequence[Message], now: float) -> None:
        """A replay answer to ``probe_from()`` (messages in sequence order, the end marker removed)."""
        start = self.probe_from()
        first = messages[0] if messages else None
        if first is not None and self.next_seq is not None and first.seq == start and first.digest == self.last_digest:
            self._catch_up(messages[1:], now)  # the same publisher: apply what was missed
        elif first is not None and first.seq == 0:  # the whole history: rebuild
            self._reset()
            self._catch_up(messages, now)
        elif first is None and start == 0:  # a publisher that never published: an empty cache
            self._reset()
            self._set(True, "exact", now)
        elif first is None or first.seq == start:
            # nothing at or after the last applied message, or another payload under its number: a
            # new publisher (a restarted engine); the next probe asks for its history from 0
            self._reset()
            self._set(False, "restarted", now)
        else:  # its buffer no longer holds what was missed
            self._set(False, "unrecoverable", now)

    def _catch_up(self, messages: Sequence[Message], now: float) -> None:
        for msg in messages:
            if msg.seq != (self.next_seq if self.next_seq is not None else 0):
                self._set(False, "gap", now)
                return
            self._apply(msg)
        self._set(True, "exact", now)

    def on_probe_timeout(self, now: float) -> None:
        """The publisher did not answer within the poll: dead (or unreachable)."""
        self._set(False, "dead", now)


class BlockMap:
    """Fingerprint block key → engine block hash, LRU-bounded (``capacity`` entries); ``None``: identity."""

    def __init__(self, capacity: int = 1_000_000, identity: bool = False) -> None:
        self.capacity = capacity
        self.identity = identity
        self._map: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._map)

    def learn(self, pairs: Iterable[tuple[int, int]]) -> int:
        """Remember (fingerprint key, engine hash) pairs; returns how many were new."""
        m = self._map
        new = 0
        for key, h in pairs:
            if key in m:
                m.move_to_end(key)
            else:
                new += 1
            m[key] = h
        while len(m) > self.capacity:
            m.popitem(last=False)
        return new

    def get(self, key: int) -> int | None:
        return key if self.identity else self._map.get(key)


class PreciseIndex(PrefixIndex):
    """The approximate ``PrefixIndex`` with an exact answer wherever a slot's mirror is synced.

    ``matched_tokens(slot, fp)``: for a synced slot, the tokens of the longest prefix of ``fp`` whose
    last block maps to an engine block the slot holds (held blocks of a chain form a prefix: SGLang
    evicts leaves first, so a binary search); otherwise the approximate answer.
    """

    def __init__(self, default_capacity: int, block_map: BlockMap) -> None:
        super().__init__(default_capacity)
        self.block_map = block_map
        self.mirrors: dict[Hashable, EngineMirror] = {}

    def mirror(self, slot: Hashable) -> EngineMirror:
        m = self.mirrors.get(slot)
        if m is None:
            m = self.mirrors[slot] = EngineMirror()
        return m

    def exact(self, slot: Hashable) -> bool:
        m = self.mirrors.get(slot)
        return m is not None and m.synced

    def matched_tokens(self, slot: Hashable, fp: Fingerprint, cum: Sequence[int] | None = None) -> int:
        m = self.mirrors.get(slot)
        if m is None or not m.synced:
            return super().matched_tokens(slot, fp, cum)
        if not fp:
            return 0
        held, get = m.blocks, self.block_map.get
        lo, hi = 0, len(fp)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            h = get(fp[mid - 1][0])
            if h is not None and h in held:
                lo = mid
            else:
                hi = mid - 1
        if cum is not None:
            return cum[lo]
        return sum(n for _, n in fp[:lo])


__all__ = ["BlockMap", "EngineMirror", "Event", "Message", "PreciseIndex"]
