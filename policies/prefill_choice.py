"""The prefill partner of a disaggregated dispatch: which prefill backend computes the turn's KV.

The decision core admits and routes on the decode side (its seats, team limits and wait bound count
the decode KV the whole context holds for the turn's lifetime); this policy then picks, among the
model's healthy prefill backends, the one expected to finish the prompt's prefill first, counting
what its prefix cache probably already holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.prefix_index import DEFAULT_CAPACITY_TOKENS, PrefixIndex
from policies.types import Fingerprint

DEFAULT_LOAD_BOUND = 1.25
DEFAULT_MIN_SLACK = 1


@dataclass(frozen=True, slots=True)
class PrefillPick:
    backend: str
    matched_tokens: int
    """Tokens of the prompt the chosen backend probably holds (its prefill skips them)."""
    reason: str
    """``prefix`` (the most cached tokens among the candidates), else ``least_wait``."""


class PrefillChooser:
    """Pick the prefill backend for a prompt by expected cached prefix and prefill queue, load bounded.

    For each healthy candidate ``p`` (the caller passes the healthy ones, in a stable order):

    - ``cached(p)``: the prompt's tokens ``p`` probably holds (a ``PrefixIndex`` slot per prefill
      backend, fed at dispatch with the prompt's fingerprint, bounded by ``p``'s KV tokens);
    - ``queue(p)``: the tokens ``p`` still has to prefill for the legs in flight there (each leg
      counts its prompt minus what it was expected to find cached, from dispatch to its end);
    - ``cost(p) = queue(p) + prompt_tokens - cached(p)``: the tokens ``p`` computes before this
      prompt's last one, i.e. its expected time to the handover at a prefill rate common to all.

    The pick is ``argmin cost``, ties to fewer legs in flight, then the candidates' order. Bounded
    load: a candidate with ``legs(p) >= max(ceil(load_bound * (legs_total + 1) / n), legs_min + min_slack)``
    is left out unless every candidate is (consistent hashing with bounded loads' rule), so a run of
    long prompts that share a prefix cannot all pile on one prefill backend while another idles.

    Parameters (defaults): ``load_bound`` 1.25, ``min_slack`` 1 (a backend may always run one leg
    more than the least loaded), ``capacity_tokens`` 1,000,000 per backend until ``set_capacity``.
    Pure: no I/O, no clock; ``started``/``finished`` are the events.
    """

    def __init__(
        self,
        load_bound: float = DEFAULT_LOAD_BOUND,
        min_slack: int = DEFAULT_MIN_SLACK,
        capacity_tokens: int = DEFAULT_CAPACITY_TOKENS,
    ) -> None:
        if load_bound < 1.0:
            raise ValueError("load_bound must be at least 1")
        self.load_bound = load_bound
        self.min_slack = max(0, min_slack)
        self.index = PrefixIndex(capacity_tokens)
        self._legs: dict[str, dict[str, int]] = {}
        """Per backend, the legs in flight: rid → tokens still to prefill."""

    def set_capacity(self, backend: str, kv_tokens: int) -> None:
        self.index.set_capacity(backend, kv_tokens)

    def legs(self, backend: str) -> int:
        return len(self._legs.get(backend, ()))

    def queue_tokens(self, backend: str) -> int:
        return sum(self._legs.get(backend, {}).values())

    def pick(self, candidates: Sequence[str], fp: Fingerprint, prompt_tokens: int) -> PrefillPick | None:
        """The candidate for ``fp`` (None when there is none)."""
        if not candidates:
            return None
        matched = self.index.match_all(fp, candidates)
        legs = {c: self.legs(c) for c in candidates}
        total = sum(legs.values())
        cap = max(math.ceil(self.load_bound * (total + 1) / len(candidates)), min(legs.values()) + self.min_slack)
        allowed = [c for c in candidates if legs[c] < cap] or list(candidates)
        order = {c: i for i, c in enumerate(candidates)}

        def cost(c: str) -> tuple[int, int, int]:
            return (self.queue_tokens(c) + max(0, prompt_tokens - matched[c]), legs[c], order[c])

        best = min(allowed, key=cost)
        top = max(matched.values())
        reason = "prefix" if top > 0 and matched[best] == top else "least_wait"
        return PrefillPick(best, matched[best], reason)

    def started(self, rid: str, backend: str, fp: Fingerprint, prompt_tokens: int, matched_tokens: int) -> None:
        """A leg went to ``backend``: it will hold ``fp``'s blocks; its uncached tokens join the queue."""
        self.index.insert(backend, fp)
        self._legs.setdefault(backend, {})[rid] = max(0, prompt_tokens - matched_tokens)

    def finished(self, rid: str, backend: str) -> None:
        """The leg ended (answered, failed or cancelled)."""
        legs = self._legs.get(backend)
        if legs is not None:
            legs.pop(rid, None)

    def forget(self, backend: str) -> None:
        """``backend`` restarted or left: its cache is gone."""
        self.index.drop(backend)
