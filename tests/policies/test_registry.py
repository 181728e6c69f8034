"""policies/registry.py: named stacks, routers and admissions; a stack's halves replaced by name."""

from __future__ import annotations

import pytest

from policies import registry
from policies.admission import SeatedAdmission
from policies.core import PassThroughCore
from policies.routers import LeastLoad, MinTTFT, SglangCacheAware
from policies.routing import RoundRobin

ROUTER_TYPES = {
    "direct": RoundRobin,
    "round-robin": RoundRobin,
    "least-load": LeastLoad,
    "sglang-cache-aware": SglangCacheAware,
    "min-ttft": MinTTFT,
}


def test_the_name_lists_are_sorted_and_complete() -> None:
    assert registry.names() == ["direct", "gateway", "least-load", "round-robin", "sglang-cache-aware"]
    assert registry.routing_names() == sorted(ROUTER_TYPES)
    assert registry.admission_names() == ["none", "seats"]


@pytest.mark.parametrize("name", sorted(ROUTER_TYPES))
def test_router_gives_a_fresh_router_of_its_kind(name: str) -> None:
    a, b = registry.router(name), registry.router(name)
    assert type(a) is ROUTER_TYPES[name] and a is not b
    assert a.name == name


def test_an_unknown_router_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown routing 'nope'; known: direct, least-load, min-ttft"):
        registry.router("nope")


@pytest.mark.parametrize(
    ("stack", "core", "router"),
    [
        ("direct", PassThroughCore, RoundRobin),
        ("round-robin", PassThroughCore, RoundRobin),
        ("least-load", PassThroughCore, LeastLoad),
        ("sglang-cache-aware", PassThroughCore, SglangCacheAware),
        ("gateway", SeatedAdmission, MinTTFT),
    ],
)
def test_each_stack_is_its_admission_over_its_router(stack: str, core: type, router: type) -> None:
    built = registry.build(stack)
    assert type(built) is core and type(built.router) is router
    assert built.name == stack  # the stack's label, whatever its router is called


def test_direct_and_round_robin_differ_in_ranks() -> None:
    assert registry.build("direct").router.over_ranks is False  # type: ignore[attr-defined]
    assert registry.build("round-robin").router.over_ranks is True  # type: ignore[attr-defined]


def test_either_half_is_replaced_by_name_and_keeps_the_stacks_label() -> None:
    seated = registry.build("least-load", admission="seats")
    assert isinstance(seated, SeatedAdmission) and isinstance(seated.router, LeastLoad)
    assert seated.name == "least-load"
    bare = registry.build("gateway", admission="none")
    assert isinstance(bare, PassThroughCore) and isinstance(bare.router, MinTTFT) and bare.name == "gateway"
    both = registry.build("direct", routing="sglang-cache-aware", admission="seats")
    assert isinstance(both, SeatedAdmission) and isinstance(both.router, SglangCacheAware)


def test_unknown_names_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown policy 'fast'; known: direct, gateway"):
        registry.build("fast")
    with pytest.raises(ValueError, match="unknown admission 'queue'; known: none, seats"):
        registry.build("gateway", admission="queue")
    with pytest.raises(ValueError, match="unknown routing 'x'"):
        registry.build("gateway", routing="x")


def test_router_params_configure_the_stacks_min_ttft_router() -> None:
    core = registry.build("gateway", router_params={"tie_rel": 0.5, "stay": 3.0, "seed": 7})
    assert isinstance(core.router, MinTTFT)
    assert (core.router.tie_rel, core.router.stay) == (0.5, 3.0)
    assert registry.build("gateway").router.stay == 10.0  # type: ignore[attr-defined]  # defaults otherwise
    with pytest.raises(TypeError):
        registry.build("gateway", router_params={"no_such_parameter": 1})


def test_router_params_do_not_reach_other_routers() -> None:
    core = registry.build("least-load", router_params={"tie_rel": 0.5})  # only min-ttft takes parameters
    assert isinstance(core.router, LeastLoad)


def test_router_params_reach_a_min_ttft_router_named_by_routing() -> None:
    core = registry.build("gateway", routing="min-ttft", router_params={"stay": 3.0})
    assert isinstance(core.router, MinTTFT) and core.router.stay == 3.0


def test_each_build_is_a_fresh_core_with_a_fresh_router() -> None:
    a, b = registry.build("gateway"), registry.build("gateway")
    assert a is not b and a.router is not b.router
