"""Team demand, targets and the ``teams:`` sections of ``cachegate plan`` (``loadtest/plan/recommend.py``): the limits
written for the recommended fleet, and the config every candidate fleet is simulated with (the bound in force)."""

from __future__ import annotations

import math
from dataclasses import dataclass

HEADROOM = 1.25


@dataclass(frozen=True)
class Targets:
    ttft_p50_s: float = 2.0
    ttft_p95_s: float = 20.0
    max_wait_s: float = 120.0

    def misses(self, row: dict) -> list[str]:
        """The targets ``row`` misses (empty: it meets them)."""
        out = []
        for key, limit in (
            ("ttft_p50_s", self.ttft_p50_s),
            ("ttft_p95_s", self.ttft_p95_s),
            ("max_wait_s", self.max_wait_s),
        ):
            value = row.get(key)
            if value is None or value > limit:
                out.append(key)
        return out


@dataclass(frozen=True)
class TeamDemand:
    name: str
    developers: int
    per_developer: float
    """Concurrent agent conversations per developer at the busy hour."""

    @property
    def conversations(self) -> int:
        return max(1, round(self.developers * self.per_developer))


def teams_config(teams: list[TeamDemand], peaks: dict[str, int], targets: Targets) -> dict:
    """The ``teams:`` section for the recommended fleet."""
    timeout = max(300.0, 2 * targets.max_wait_s)
    return {
        t.name: {
            "max_concurrency": max(1, min(t.conversations, math.ceil(peaks.get(t.name, 1) * HEADROOM))),
            "max_queue": t.conversations,
            "queue_timeout_s": timeout,
            "weight": 1,
            "priority": 0,
            "max_wait_s": targets.max_wait_s,
        }
        for t in teams
    }


def bound_config(teams: list[TeamDemand], targets: Targets) -> dict:
    """The config the search simulates with: every team limited by nothing but its conversations, with
    the target's max wait as its ``max_wait_s``."""
    return {
        "teams": {
            t.name: {
                "max_concurrency": t.conversations,
                "max_queue": t.conversations,
                "queue_timeout_s": max(300.0, 2 * targets.max_wait_s),
                "max_wait_s": targets.max_wait_s,
            }
            for t in teams
        }
    }
