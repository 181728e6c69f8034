"""State that replicas must agree on, shared through Redis.

- **Team leases**: a dispatched request holds a lease of its team. In Redis a team's leases are one
  hash, one count per replica (``gateway/state/redis_scripts.py``); taking one is one Lua call that also
  applies this replica's releases not yet written, and renewing every lease a replica holds is its
  heartbeat (one call per second whatever it holds), so a replica that dies gives its slots back
  within ``lease_ttl_s``. A refused lease goes back to the core as ``requeue``; a release publishes
  a wake-up on pub/sub only when some replica waits for that team (no polling).
- **Live replicas**: each replica heartbeats into a sorted set; ``1 / live replicas`` is this
  replica's share of every limit that is not a lease (seat budget per backend, queue bound, token
  rate), so two replicas never overfill one engine between them.
- **Runtime team limits**: a hash written by the admin API, versioned; a change is published and
  applied by every replica, read back at start, and written back by every replica that finds
  Redis emptied (restart without persistence, flush), so it survives those too.
- **Faults** (``gateway/state/redis_state.py``): when Redis is unreachable or lost its state, a replica
  keeps serving and enforces its share of every limit (concurrency included) locally, says so
  (log, ``cachegate_redis_degraded``, ``/readyz`` detail), re-registers what it holds under the
  current epoch when Redis answers, and returns to shared enforcement only after a settling period
  in which every replica it knew has registered again.

Without a Redis URL, ``MemoryState`` serves the same interface for one process: the core's own
counters are then exact and every lease is granted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.state.redis_state import RedisState

__all__ = ["MemoryState", "RedisState"]


class MemoryState:
    """One process, no Redis: leases always granted (the core's counters are exact), share 1."""

    degraded = False
    replicas = 1
    shared = False

    def __init__(self) -> None:
        self.on_wake: Callable[[str], None] = lambda team: None
        self.on_limits: Callable[[str, dict[str, Any]], None] = lambda team, fields: None
        self.on_share: Callable[[float, bool], None] = lambda share, split: None
        self._teams: dict[str, dict[str, Any]] = {}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def acquire(self, team: str, rid: str, limit: int) -> bool:
        return True

    async def release(self, team: str, rid: str) -> None:
        return None

    async def set_team(self, team: str, fields: dict[str, Any]) -> None:
        self._teams[team] = fields
        self.on_limits(team, fields)

    async def teams(self) -> dict[str, dict[str, Any]]:
        return dict(self._teams)

    def status(self) -> dict[str, Any]:
        return {"mode": "memory", "replicas": 1}
