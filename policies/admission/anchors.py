"""How admission knows a conversation without an id: anchors, and the first turn's seat.

A seated conversation's *anchor* is the last full block of its latest prompt (``fp[-2]``; the last block is
partial and changes as the prompt grows); a request whose fingerprint holds an anchor continues that
conversation (``records.conversation_of``). With ``release_first_turns`` (off by default) a turn that continues
no known conversation (key ``rid:…``) gives up its seat as soon as it finishes (``_release_first_turn``): one-shots
held for ``idle_release_s`` filled the pool with idle seats (the many-tenant trace: docs/benchmarks.md, "Shared
prefixes and one-shot turns"). It is off by default because a coding conversation's second turn would then
wait for a new seat under pressure. Its anchor stays ``idle_release_s``, so a second turn, should one come, is
known as that conversation and keeps its seat from then on.
"""

from __future__ import annotations

from collections import deque

from policies.admission.records import Seat
from policies.admission.sizing import SeatSizing
from policies.types import Fingerprint


class Anchoring(SeatSizing):
    """Anchors of ``SeatedAdmission``; mixed in, it reads the core's seats."""

    _loose: deque[tuple[float, int, str]]
    """Anchors of released first-turn seats, oldest first, with when they were released."""

    def _anchor(self, seat: Seat, fp: Fingerprint) -> None:
        """``seat``'s conversation is now found by the last full block of ``fp``."""
        anchor = fp[-2 if len(fp) > 1 else -1][0]
        if seat.anchor is not None and seat.anchor != anchor:
            self.anchors.pop(seat.anchor, None)
        seat.anchor = anchor
        self.anchors[anchor] = seat.key

    def _release_first_turn(self, seat: Seat, now: float) -> None:
        """Give up the idle seat of a first turn of no known conversation, keeping its anchor a while."""
        anchor = seat.anchor
        self._release(seat)
        if anchor is not None:
            self.anchors[anchor] = seat.key
            self._loose.append((now, anchor, seat.key))

    def _expire_anchors(self, now: float) -> None:
        """Forget the anchors of released first turns that no second turn took within ``idle_release_s``."""
        loose = self._loose
        while loose and now - loose[0][0] > self.params.idle_release_s:
            _, anchor, key = loose.popleft()
            seat = self.seats.get(key)
            # gone unless a seat still knows its conversation by it (a second turn re-seated it anew)
            if self.anchors.get(anchor) == key and (seat is None or seat.anchor != anchor):
                del self.anchors[anchor]
