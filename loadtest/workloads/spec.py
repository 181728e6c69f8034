"""Which workload a name means: ``coding-agent``, a member of the routing family
(``loadtest.workloads.FAMILY``) or ``trace:PATH``. Apart from ``loadtest/workloads/core.py`` because the
family's generators build on it."""

from __future__ import annotations

from pathlib import Path

from loadtest.workloads import FAMILY
from loadtest.workloads.core import CodingAgent, TraceWorkload, Workload


def make_workload(
    spec: str,
    *,
    seed: int = 1,
    scale: float = 1.0,
    think_scale: float = 1.0,
    speedup: float = 1.0,
    warm_start: bool = False,
) -> Workload:
    """``coding-agent``, a member of ``loadtest.workloads.FAMILY`` or ``trace:PATH`` (``warm_start``: see
    ``CodingAgent``)."""
    if spec == "coding-agent":
        return CodingAgent(seed=seed, scale=scale, think_scale=think_scale, warm_start=warm_start)
    if spec in FAMILY:
        return FAMILY[spec].make(seed=seed, scale=scale, speedup=speedup)
    if spec.startswith("trace:"):
        path = Path(spec.removeprefix("trace:"))
        if not path.is_file():
            raise ValueError(f"trace file not found: {path}")
        return TraceWorkload(path, speedup=speedup, scale=scale, seed=seed, name=spec)
    known = ", ".join(["coding-agent", *FAMILY, "trace:PATH"])
    raise ValueError(f"unknown workload '{spec}'; known: {known}")
