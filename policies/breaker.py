"""Circuit breaker for one backend: a pure state machine, time passed in.

States: ``closed`` (requests flow) → ``open`` (no requests) → ``half_open`` (one probe) → back.

- Opens when ``consecutive_failures`` (default 5) requests in a row fail, when the failure rate over
  the last ``window`` (20) outcomes reaches ``error_rate`` (0.5) with at least ``min_samples`` (10)
  of them, or at once on a connection failure (``trip``): the backend is not there.
- Stays open ``open_s`` (5 s), doubling each time it opens again from half-open, up to
  ``max_open_s`` (60 s).
- Then half-open: still no requests; the next health check is the probe: success closes the
  breaker, a failed request or check opens it again. So no request is routed to a backend from the
  moment its breaker opens until a health check has seen it back.

A failure is a connection error, a timeout, a 5xx or a stream that breaks; a 4xx is the request's
fault and counts as a success here (one bad request must never take a backend out).
"""

from __future__ import annotations

from collections import deque
from typing import Literal

State = Literal["closed", "open", "half_open"]
STATE_CODE: dict[State, int] = {"closed": 0, "half_open": 1, "open": 2}


class Breaker:
    def __init__(
        self,
        consecutive_failures: int = 5,
        error_rate: float = 0.5,
        window: int = 20,
        min_samples: int = 10,
        open_s: float = 5.0,
        max_open_s: float = 60.0,
    ) -> None:
        self.consecutive_failures = consecutive_failures
        self.error_rate = error_rate
        self.min_samples = min_samples
        self.base_open_s = open_s
        self.max_open_s = max_open_s
        self.outcomes: deque[bool] = deque(maxlen=window)
        self.streak = 0
        self.opened_at: float | None = None
        self.open_s = open_s
        self.trips = 0

    def state(self, now: float) -> State:
        if self.opened_at is None:
            return "closed"
        return "half_open" if now - self.opened_at >= self.open_s else "open"

    def routable(self, now: float) -> bool:
        """Whether requests may be routed to the backend."""
        return self.opened_at is None

    def success(self, now: float) -> None:
        self.outcomes.append(True)
        self.streak = 0
        if self.opened_at is not None and self.state(now) == "half_open":
            self.opened_at = None
            self.open_s = self.base_open_s
            self.outcomes.clear()

    def failure(self, now: float) -> None:
        self.outcomes.append(False)
        self.streak += 1
        state = self.state(now)
        if state == "half_open":
            self._open(now, backoff=True)
        elif state == "closed":
            failed = self.outcomes.count(False)
            if self.streak >= self.consecutive_failures or (
                len(self.outcomes) >= self.min_samples and failed / len(self.outcomes) >= self.error_rate
            ):
                self._open(now)

    def trip(self, now: float) -> None:
        """Open at once (connection refused or reset: the backend is not there)."""
        self.outcomes.append(False)
        self.streak += 1
        self._open(now, backoff=self.state(now) == "half_open")

    def _open(self, now: float, backoff: bool = False) -> None:
        if backoff:
            self.open_s = min(self.max_open_s, self.open_s * 2)
        elif self.opened_at is None:
            self.open_s = self.base_open_s
        self.opened_at = now
        self.trips += 1
