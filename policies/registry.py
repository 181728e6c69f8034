"""Named policy stacks (interfaces §3): the names `cachegate simulate --policy` and the config's
`policy:` key accept. Later issues add their stacks here."""

from __future__ import annotations

from collections.abc import Callable

from policies.core import DecisionCore, PassThroughCore
from policies.routers import LeastLoad, MinTTFT, SglangCacheAware
from policies.routing import RoundRobin, Router

ROUTERS: dict[str, Callable[[], Router]] = {
    "direct": lambda: RoundRobin(over_ranks=False),
    "round-robin": lambda: RoundRobin(over_ranks=True),
    "least-load": LeastLoad,
    "sglang-cache-aware": SglangCacheAware,
    "min-ttft": MinTTFT,
}
"""Routing halves by name (``--routing NAME`` overrides a stack's router)."""


def _pass_through(default_router: str, label: str) -> Callable[..., DecisionCore]:
    """A stack with no admission: ``PassThroughCore`` over ``router`` (default: ``default_router``)."""

    def make(router: Router | None = None) -> DecisionCore:
        return PassThroughCore(router if router is not None else ROUTERS[default_router](), label)

    return make


STACKS: dict[str, Callable[..., DecisionCore]] = {
    "direct": _pass_through("direct", "direct"),
    "round-robin": _pass_through("round-robin", "round-robin"),
    "least-load": _pass_through("least-load", "least-load"),
    "sglang-cache-aware": _pass_through("sglang-cache-aware", "sglang-cache-aware"),
    # The product stack: min-TTFT routing; admission (issue 5) replaces the pass-through core.
    "gateway": _pass_through("min-ttft", "gateway"),
}
"""Stack factories; each takes an optional ``router`` instance replacing its default router."""


def router(name: str) -> Router:
    """A fresh router ``name`` (a key of ``ROUTERS``)."""
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown routing '{name}'; known: {', '.join(sorted(ROUTERS))}") from None


def build(name: str, routing: str | None = None) -> DecisionCore:
    """A fresh decision core for the stack ``name``, its router replaced by ``routing`` if given."""
    try:
        factory = STACKS[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; known: {', '.join(sorted(STACKS))}") from None
    return factory() if routing is None else factory(router=router(routing))


def routing_names() -> list[str]:
    return sorted(ROUTERS)


def names() -> list[str]:
    return sorted(STACKS)
