"""Named policy stacks (interfaces §3): the names `cachegate simulate --policy` and the config's
`policy:` key accept. Later issues add their stacks here."""

from __future__ import annotations

from collections.abc import Callable

from policies.core import DecisionCore, PassThroughCore
from policies.routing import RoundRobin

STACKS: dict[str, Callable[[], DecisionCore]] = {
    "direct": lambda: PassThroughCore(RoundRobin(over_ranks=False), "direct"),
    "round-robin": lambda: PassThroughCore(RoundRobin(over_ranks=True), "round-robin"),
    # The product stack. Until admission (issue 5) and routing (issue 6) land it is plain
    # round-robin over healthy servers with no admission: the foundation's behaviour.
    "gateway": lambda: PassThroughCore(RoundRobin(over_ranks=False), "gateway"),
}


def build(name: str) -> DecisionCore:
    """A fresh decision core for the stack ``name``."""
    try:
        return STACKS[name]()
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; known: {', '.join(sorted(STACKS))}") from None


def names() -> list[str]:
    return sorted(STACKS)
