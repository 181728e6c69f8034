"""Named policy stacks: the names `cachegate simulate --policy` and the config's `policy:` key accept
(`direct`, `round-robin`, `least-load`, `sglang-cache-aware`: no admission; `gateway`: the product)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policies.admission import SeatedAdmission
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


ADMISSIONS: dict[str, Callable[[Router, str], DecisionCore]] = {
    "none": lambda router, label: PassThroughCore(router, label),
    "seats": lambda router, label: SeatedAdmission(router, name=label),
}
"""Admission halves by name (``--admission NAME`` overrides a stack's admission)."""


def _stack(default_router: str, label: str, default_admission: str = "none") -> Callable[..., DecisionCore]:
    """A stack: ``default_admission`` over ``default_router``, either replaceable by name."""

    def make(
        router: Router | None = None, admission: str | None = None, router_params: Mapping[str, Any] | None = None
    ) -> DecisionCore:
        if router is not None:
            chosen = router
        elif default_router == "min-ttft":  # the one router whose parameters a config may set
            chosen = MinTTFT(**dict(router_params or {}))
        else:
            chosen = ROUTERS[default_router]()
        return ADMISSIONS[admission or default_admission](chosen, label)

    return make


STACKS: dict[str, Callable[..., DecisionCore]] = {
    "direct": _stack("direct", "direct"),
    "round-robin": _stack("round-robin", "round-robin"),
    "least-load": _stack("least-load", "least-load"),
    "sglang-cache-aware": _stack("sglang-cache-aware", "sglang-cache-aware"),
    # The product stack: seats (policies/admission/) over min-TTFT routing.
    "gateway": _stack("min-ttft", "gateway", "seats"),
}
"""Stack factories; each takes an optional ``router`` instance replacing its default router."""


def router(name: str, params: Mapping[str, Any] | None = None) -> Router:
    """A fresh router ``name`` (a key of ``ROUTERS``); ``params`` (the config's ``router:``) reach a
    ``min-ttft`` router, the one whose parameters a config may set."""
    if name == "min-ttft":
        return MinTTFT(**dict(params or {}))
    try:
        return ROUTERS[name]()
    except KeyError:
        raise ValueError(f"unknown routing '{name}'; known: {', '.join(sorted(ROUTERS))}") from None


def build(
    name: str, routing: str | None = None, admission: str | None = None, router_params: Mapping[str, Any] | None = None
) -> DecisionCore:
    """A fresh decision core for the stack ``name``; ``routing`` / ``admission`` replace its halves;
    ``router_params`` (the config's ``router:``) are keyword parameters of its ``min-ttft`` router."""
    try:
        factory = STACKS[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; known: {', '.join(sorted(STACKS))}") from None
    if admission is not None and admission not in ADMISSIONS:
        raise ValueError(f"unknown admission '{admission}'; known: {', '.join(sorted(ADMISSIONS))}")
    return factory(
        router=None if routing is None else router(routing, router_params),
        admission=admission,
        router_params=router_params,
    )


def admission_names() -> list[str]:
    return sorted(ADMISSIONS)


def routing_names() -> list[str]:
    return sorted(ROUTERS)


def names() -> list[str]:
    return sorted(STACKS)
