"""Building a simulated run's parts from names: the decision core of a policy stack (with its
overrides and ``--config``), and the config file itself. Split from ``simulate.py``, which
re-exports ``build_core``."""

from __future__ import annotations

from pathlib import Path

from policies.core import DecisionCore


def build_core(policy: str, admission: str | None = None, routing: str | None = None,
               config: dict | None = None) -> DecisionCore:
    """The decision core for ``--policy`` with optional ``--admission`` / ``--routing`` overrides.

    Overrides are passed to ``policies.registry.build(policy, admission=..., routing=...)`` once the
    registry accepts them; until then naming one is an error that says so. ``config`` (the
    ``--config`` file's content) goes to ``core.configure(config)`` when the core has it (team
    limits arrive with admission control; until then it is accepted and ignored).
    """
    import inspect

    from policies import registry

    kwargs: dict[str, str] = {}
    if admission is not None:
        kwargs["admission"] = admission
    if routing is not None:
        kwargs["routing"] = routing
    params = inspect.signature(registry.build).parameters
    missing = [k for k in kwargs if k not in params]
    if missing:
        raise ValueError(f"--{missing[0]} is not supported by this build (no {missing[0]} overrides "
                         f"registered yet); policies: {', '.join(registry.names())}")
    core = registry.build(policy, **kwargs)
    if config is not None and hasattr(core, "configure"):
        core.configure(config)
    return core


def load_config(path: Path | None) -> dict | None:
    if path is None:
        return None
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping (interfaces §6 shape)")
    return data
