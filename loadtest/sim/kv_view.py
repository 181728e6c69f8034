"""``cachegate simulate --cache-view precise``: the router's prefix index fed by the engine model's own
cache events, as the live gateway is fed by SGLang's KV events (``policies/kv_view.py``).

Each rank's radix cache (``backends/sim/radix.py``) reports every block it stores and every block it
evicts; ``_Feed`` hands each change to that slot's ``EngineMirror`` as one message of a gap-free
sequence (virtual time: no publishing or network lag, no lost messages). The simulator's fingerprint
blocks are the engine's blocks, so the ``BlockMap`` is the identity: the precise view here is the
ceiling of what events can give, with the live matching's losses measured apart (docs/kv-events.md).
"""

from __future__ import annotations

from typing import Any

from policies.kv_view import BlockMap, EngineMirror, Message, PreciseIndex

CACHE_VIEWS = ("approximate", "precise")


class _Feed:
    """A radix cache observer that turns each change into the next message of its mirror."""

    __slots__ = ("mirror", "seq")

    def __init__(self, mirror: EngineMirror) -> None:
        self.mirror = mirror
        self.seq = 0

    def _send(self, kind: str, hashes: tuple[int, ...], parent: int | None) -> None:
        self.mirror.on_message(Message(self.seq, b"", [(kind, hashes, parent)]), 0.0)
        self.seq += 1

    def stored(self, key: int, parent: int, ntok: int) -> None:
        self._send("stored", (key,), parent or None)

    def removed(self, key: int, ntok: int) -> None:
        self._send("removed", (key,), None)

    def cleared(self) -> None:
        self._send("cleared", (), None)


def attach_precise_view(core: Any, engines: dict[str, Any]) -> PreciseIndex:
    """Replace the router's ``PrefixIndex`` by a ``PreciseIndex`` fed by ``engines``' caches."""
    precise = core.router.swap_index(lambda index: PreciseIndex(index.default_capacity, BlockMap(identity=True)))
    if not isinstance(precise, PreciseIndex):
        name = core.router.name
        raise ValueError(f"--cache-view precise needs a router with a prefix index (min-ttft), not {name}")
    for name, engine in engines.items():
        ranks = engine._ranks
        for i, rank in enumerate(ranks):
            mirror = precise.mirror((name, i if len(ranks) > 1 else None))
            mirror.on_replay([], 0.0)  # a publisher that has published nothing: an empty cache, exact
            rank.cache.observer = _Feed(mirror)
    return precise
