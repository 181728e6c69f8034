"""Builders for the seated admission core's tests: a core over N backends, a request, its dispatches."""

from __future__ import annotations

import itertools

from policies.admission import SeatedAdmission, SeatParams
from policies.routing import RoundRobin
from policies.teams import TeamLimits
from policies.types import BackendView, Dispatch, RequestFacts

_ids = itertools.count()


def core(
    kv: int = 10_000, backends: int = 1, teams: dict[str, TeamLimits] | None = None, **params: float | str
) -> SeatedAdmission:
    c = SeatedAdmission(
        RoundRobin(), teams=teams or {}, params=SeatParams(**{"admit_water": 1.0, "high_water": 1.0, **params})
    )  # type: ignore[arg-type]
    c.set_backends("m", [BackendView(f"b{i}", kv_tokens=kv) for i in range(backends)], 0.0)
    return c


def req(team: str = "t", tokens: int = 900, out: int = 100, conv: str | None = None, prio: int = 0) -> RequestFacts:
    return RequestFacts(
        rid=f"r{next(_ids)}",
        model="m",
        team=team,
        prompt_tokens=tokens,
        max_output_tokens=out,
        conversation=conv,
        priority=prio,
    )


def dispatched(decisions: list) -> list[Dispatch]:
    return [d for d in decisions if isinstance(d, Dispatch)]
