"""What one simulated run is: its configuration (``SimConfig``), its engines and its policy label."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from loadtest.sim.driver import Faults
from loadtest.workloads.core import TeamSpec


class EngineLike(Protocol):
    """The part of ``backends.sim.engine.Engine`` the simulator uses."""

    dp_size: int
    max_total_num_tokens: int
    counters: Any

    def submit(self, req: Any, now: float) -> None: ...
    def next_time(self) -> float | None: ...
    def complete(self) -> list[Any]: ...
    def advance(self, until: float) -> list[Any]: ...
    def loads(self) -> list[Any]: ...


EngineFactory = Callable[[], EngineLike]


@dataclass
class SimConfig:
    """One simulated run: ``cachegate simulate``'s options (``loadtest/sim/simulate.py::run_one`` runs it)."""

    profile: str
    backends: int = 1
    policy: str = "direct"
    admission: str | None = None
    routing: str | None = None
    workload: str = "coding-agent"
    conversations: int = 8
    teams: list[TeamSpec] | None = None
    minutes: float = 20.0
    warmup_minutes: float = 5.0
    seed: int = 1
    kv_tokens: int | None = None
    unbounded: bool = False
    scale: float = 1.0
    think_scale: float = 1.0
    speedup: float = 1.0
    warm_start: bool = False
    config: Path | None = None
    tick_s: float = 0.25
    refresh_s: float = 1.0
    oracle: bool = False
    """Hand the core the true conversation id, token counts and output length (a ceiling)."""
    max_tokens: int = 0
    """What the simulated clients send as ``max_tokens`` (0: none, the core assumes its default)."""
    faults: Faults = field(default_factory=Faults)
    visibility: str = "white"
    """``white``: the core sees the engines' capacity and loads; ``blind``: nothing but what the gateway
    observes (``SimPool(blind=True)``: a limit learned from time to first token)."""
    first_slot: int = 0
    """Index of the first conversation slot: slots ``first_slot … first_slot + N − 1`` (one engine serving
    its share of a fleet's conversations, ``loadtest/analysis/mixed_fleet.py``)."""
    cache_view: str = "approximate"
    """``precise``: the router's index fed by the engines' cache events (``loadtest/sim/kv_view.py``)."""


def fleet_profiles(profile: str) -> list[str]:
    """``A+B+...`` → the profiles a mixed fleet's backends run in turn (backend ``i`` runs the
    ``i mod n``-th: ``gb10x16-tp4pp4-fp8+gb10x16-tp4pp4-fp8-vllm`` on 2 backends is one SGLang, one vLLM)."""
    return [p.strip() for p in profile.split("+")]


def default_engine_factory(cfg: SimConfig) -> EngineFactory:
    """New engines of ``cfg``'s profile(s) (a mixed fleet's in turn), with its KV size."""
    from backends.sim.engine import Engine, get_profile

    profiles = itertools.cycle([get_profile(p) for p in fleet_profiles(cfg.profile)])
    return lambda: Engine(next(profiles), kv_tokens=cfg.kv_tokens, unbounded=cfg.unbounded)


def policy_label(cfg: SimConfig) -> str:
    """The ``policy`` column of a run's row: the policy, then its visibility, admission and routing if set."""
    parts = [cfg.policy]
    if cfg.visibility != "white":
        parts.append(cfg.visibility)
    if cfg.admission:
        parts.append(f"admission={cfg.admission}")
    if cfg.routing:
        parts.append(f"routing={cfg.routing}")
    return "+".join(parts)
