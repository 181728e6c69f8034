"""The decision core's contract is declared, complete, and never probed.

- every method the gateway or the simulator calls on a core is declared on ``DecisionCore``;
- each registered core lists in ``hooks`` exactly the optional hooks it overrides;
- no ``hasattr``/``getattr`` in ``gateway/``, ``policies/`` or ``loadtest/`` (a capability is declared,
  not discovered at run time);
- routing hands admission what it knows in ``Dispatch.matched_tokens``;
- ``new_dispatch`` (the hot path's constructor) makes exactly the ``Dispatch`` its fields make.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from policies import registry
from policies.admission import SeatedAdmission, SeatParams
from policies.core import HOOKS, DecisionCore
from policies.routers import MinTTFT
from policies.routing import ROUTER_HOOKS, Router
from policies.types import BackendView, Dispatch, Outcome, RequestFacts, new_dispatch

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "policies", "loadtest")
CORE_NAMES = {"core", "self.core", "gw.core", "self.gw.core", "sim.core"}
ALLOWED_PROBES = {
    # An exception propagating through the admission span may be a ``Refused`` (it carries the
    # refusal); not a policy object.
    ("gateway/observability/spans.py", 'hasattr(exc, "refusal")'),
}


def _sources() -> list[tuple[str, ast.Module, str]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            out.append((str(path.relative_to(ROOT)), ast.parse(text), text))
    return out


def test_nothing_probes_objects_with_hasattr_or_getattr() -> None:
    found = []
    for name, tree, text in _sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
            ):
                call = ast.get_source_segment(text, node) or ""
                if (name, call) not in ALLOWED_PROBES:
                    found.append(f"{name}:{node.lineno}: {call}")
    assert not found, "declare the capability in the contract instead of probing for it:\n" + "\n".join(found)


def test_every_event_sent_to_a_core_is_in_the_contract() -> None:
    declared = {n for n, _ in inspect.getmembers(DecisionCore)} | {"name", "router"}
    sent: dict[str, set[str]] = {}
    for name, tree, _ in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in CORE_NAMES:
                sent.setdefault(node.attr, set()).add(name)
    assert {"arrive", "finish", "requeue", "set_share", "configure", "snapshot"} <= set(sent), (
        "the scan must see the gateway's and the simulator's calls"
    )
    undeclared = {attr: where for attr, where in sent.items() if attr not in declared}
    assert not undeclared, f"sent to a core but not declared on DecisionCore: {undeclared}"


@pytest.mark.parametrize("stack", registry.names())
@pytest.mark.parametrize("admission", [None, *registry.admission_names()])
def test_each_core_declares_exactly_the_hooks_it_implements(stack: str, admission: str | None) -> None:
    core = registry.build(stack, admission=admission)
    assert isinstance(core, DecisionCore)
    overridden = {hook for hook in HOOKS if getattr(type(core), hook) is not getattr(DecisionCore, hook)}
    assert core.hooks == overridden


def test_a_core_without_team_limits_answers_the_hooks_with_nothing() -> None:
    core = registry.build("direct")
    assert core.team("t", 0.0) is None and core.teams == {} and core.limits == {}
    assert core.set_share(0.5, True, 0.0) == [] and core.wake("t", 0.0) == [] and core.requeue("r", 0.0) == []
    assert core.snapshot() == {}


@pytest.mark.parametrize("name", registry.routing_names())
def test_every_router_subclasses_the_routing_contract_and_declares_its_hooks(name: str) -> None:
    router = registry.router(name)
    assert isinstance(router, Router)
    overridden = {hook for hook in ROUTER_HOOKS if getattr(type(router), hook) is not getattr(Router, hook)}
    assert router.hooks == overridden


def _turns() -> tuple[RequestFacts, RequestFacts]:
    first = RequestFacts(
        rid="t1",
        model="m",
        prompt_tokens=3000,
        max_output_tokens=10,
        fingerprint=tuple((k, 1000) for k in (11, 12, 13)),
    )
    second = RequestFacts(
        rid="t2",
        model="m",
        prompt_tokens=4000,
        max_output_tokens=10,
        fingerprint=tuple((k, 1000) for k in (11, 12, 13, 14)),
    )
    return first, second


def test_routing_reports_the_matched_prefix_in_the_dispatch() -> None:
    router = MinTTFT()
    views = [BackendView("b0", kv_tokens=1_000_000), BackendView("b1", kv_tokens=1_000_000)]
    first, second = _turns()
    d1 = router.route(first, views, 0.0)
    assert d1 is not None and d1.matched_tokens == 0
    router.dispatched(first, d1, 0.0)
    router.finished("t1", d1.backend, Outcome(prompt_tokens=3000, completion_tokens=10), 1.0)
    d2 = router.route(second, views, 2.0)
    assert d2 is not None and d2.backend == d1.backend and d2.matched_tokens == 3000


def test_a_seated_turn_carries_the_matched_prefix_in_its_dispatch() -> None:
    core = SeatedAdmission(MinTTFT(), params=SeatParams())
    core.set_backends("m", [BackendView("b0", kv_tokens=1_000_000), BackendView("b1", kv_tokens=1_000_000)], 0.0)
    first, second = _turns()
    d1 = core.arrive(first, 0.0)[0]
    core.finish("t1", Outcome(prompt_tokens=3000, completion_tokens=10), 1.0)
    d2 = core.arrive(second, 2.0)[0]
    assert isinstance(d1, Dispatch) and isinstance(d2, Dispatch)
    assert d2.reason == "prefix" and d2.backend == d1.backend and d2.matched_tokens == 3000


def test_new_dispatch_is_the_dispatch_of_its_fields() -> None:
    fields = ("r1", "b0", 3, "prefix", {"seated": 1.0}, 42)
    fast, plain = new_dispatch(*fields), Dispatch(*fields)
    assert type(fast) is Dispatch and fast == plain and repr(fast) == repr(plain) and fast.scores is fields[4]
    assert dataclasses.replace(fast, reason="retry") == Dispatch("r1", "b0", 3, "retry", {"seated": 1.0}, 42)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.rid = "r2"  # type: ignore[misc]
