"""Requests that can never run are refused on arrival, not queued (pure; used by the decision core).

A request waiting at the head of the seat queue blocks new seats behind it until it fits; one that
can *never* fit would block them forever (or until its queue timeout), so the core refuses it at
once, before it queues (``SeatedAdmission.arrive`` calls ``never_runs``):

- ``context_length_exceeded`` (400): on every healthy backend of the model, the prompt is larger
  than ``high_water × max_total_num_tokens`` of one rank (the most the seats ever let one conversation
  hold there), or ``prompt ≥ context`` (``max_model_len`` the backend reports), or
  ``prompt + max_output_tokens > context``. Unknown figures (0) never refuse.
- ``team_request_tokens`` (400): ``prompt + max_output_tokens`` passes the team's
  ``max_request_tokens`` (None: no ceiling).

The pass-through core (``--admission none``) applies the same checks with ``high_water`` 1 (no seats:
the engine may fill its whole pool) and routes only to backends that ``fits``.

``prompt`` is the core's estimate (``RequestFacts.prompt_tokens``: bytes × the tokens-per-byte ratio
learned from usage), so a prompt within a few percent of a bound may be judged either way; the engine
stays the final judge, and a request it refuses gives its reservation back at once
(``Outcome.refused``).

Backfill (``head_slot``): a new-seat request that does not fit yet blocks new seats behind it only on
the slot it is waiting for (the one with the smallest shortfall), not on the whole model, so another
team's request that fits elsewhere goes now and the head's own slot only drains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from policies.teams import TeamLimits
from policies.types import BackendView, Refuse, RequestFacts, Slot


def never_runs(req: RequestFacts, views: Iterable[BackendView], high_water: float, limits: TeamLimits) -> Refuse | None:
    """A refusal when ``req`` can run on no healthy backend of its model (or passes its team's
    ceiling); None when some backend may take it (or nothing is known that says otherwise)."""
    asked = req.prompt_tokens + req.max_output_tokens
    ceiling = limits.max_request_tokens
    if ceiling is not None and asked > ceiling:
        return Refuse(
            req.rid,
            "team_request_tokens",
            f"This request asks for about {asked} tokens (prompt about {req.prompt_tokens} + "
            f"max_tokens {req.max_output_tokens}); team '{req.team}' may ask for at most {ceiling} "
            f"per request.",
            0.0,
            400,
        )
    reasons = []
    for view in views:
        if not view.healthy or view.name in req.exclude:
            continue
        why = _too_big(req, view, high_water)
        if why is None:
            return None
        reasons.append(why)
    if not reasons:
        return None  # no healthy backend: the caller's own refusal (503) says so
    return Refuse(
        req.rid,
        "context_length_exceeded",
        f"This request can never run on model '{req.model}': {min(reasons, key=len)}. "
        "Shorten the prompt or lower max_tokens.",
        0.0,
        400,
    )


def _too_big(req: RequestFacts, view: BackendView, high_water: float) -> str | None:
    prompt, out = req.prompt_tokens, req.max_output_tokens
    if view.context_tokens:
        if prompt >= view.context_tokens:
            return f"the prompt (about {prompt} tokens) does not fit its {view.context_tokens}-token context window"
        if out and prompt + out > view.context_tokens:
            return (
                f"the prompt (about {prompt} tokens) plus max_tokens {out} pass its "
                f"{view.context_tokens}-token context window"
            )
    if not can_hold(prompt, view.kv_tokens, high_water):
        return (
            f"the prompt (about {prompt} tokens) is larger than a backend's KV cache can hold "
            f"({int(high_water * view.kv_tokens)} tokens)"
        )
    return None


def fits(req: RequestFacts, view: BackendView, high_water: float) -> bool:
    """Whether ``req`` may ever run on ``view`` (its window and KV pool; unknown figures: yes)."""
    return _too_big(req, view, high_water) is None


def can_hold(prompt_tokens: int, capacity: int, high_water: float) -> bool:
    """Whether a rank of ``capacity`` KV tokens (0: unknown) can ever hold the prompt: the core never
    seats a request where it cannot run, even when that rank is empty."""
    return not capacity or prompt_tokens <= high_water * capacity


def head_slot(
    slots: Iterable[tuple[Slot, int]], need: int, used: Callable[[Slot], int], budget: Callable[[int], float]
) -> Slot | None:
    """The slot a blocked head waits for: the one where it is shortest of room (ties: by name)."""
    best: tuple[float, Slot] | None = None
    for slot, cap in slots:
        short = used(slot) + min(need, budget(cap)) - budget(cap)
        key = (short, slot)
        if best is None or (key[0], str(key[1])) < (best[0], str(best[1])):
            best = key
    return None if best is None else best[1]
