"""`cachegate plan`: how many servers, and which team limits, for N developers at a target TTFT.

For each hardware profile the planner simulates the busy hour (``coding-agent`` conversations,
``developers × conversations per developer`` of them per team) in virtual time with the
``gateway`` stack (the decision core the live gateway runs) on ``n`` servers, for several seeds.
A fleet **meets** the targets when every seed's run has median TTFT, p95 TTFT and longest wait
(TTFT samples include the time spent waiting at the gateway for a seat) within them.

Search: start at the servers whose KV holds every conversation's mean seat (``MEAN_CONTEXT``
tokens, at most ``ADMIT_WATER`` of the pool, as the seats do), step down while the fleet still
meets, up (by a quarter, then doubling steps, then bisecting) while it does not; the recommendation is the
smallest fleet that meets (and, re-simulated with the team limits on other seeds, meets again; if
not, the next one up that does), and the frontier holds every fleet evaluated (always the one below and
the one above the recommendation).

Team limits: each team's ``max_concurrency`` is its peak requests in flight at the busy hour on the
recommended fleet (largest over seeds) plus ``HEADROOM``, rounded up: a limit that does not bind on
the demand described, so it only stops a team that outgrows its forecast from taking the others'
seats. ``max_queue`` is the team's conversations; ``queue_timeout_s`` is ``max(300, 2 × max wait)``;
``max_wait_s`` (the wait bound admission plans for) is the target's max wait. Every candidate fleet is
simulated with that bound already in force (``bound_config``: each team unlimited but for it), so the
core trades throughput for the bound as the recommended configuration will.
The recommended fleet is then re-simulated with those limits on ``verify_seeds`` (other seeds).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

from loadtest.plan.teams import Targets, TeamDemand, bound_config, teams_config

MEAN_CONTEXT = 160_000
"""Tokens a seated coding-agent conversation reserves on average over its life at scale 1 (its context
grows from 20-60k to 200-250k; the seat holds the largest prompt so far plus the answer)."""
ADMIT_WATER = 0.85


@dataclass
class PlanConfig:
    teams: list[TeamDemand]
    profiles: list[str]
    targets: Targets = field(default_factory=Targets)
    seeds: tuple[int, ...] = (1, 2, 3)
    verify_seeds: tuple[int, ...] = (101, 102)
    minutes: float = 15.0
    warmup_minutes: float = 5.0
    max_servers: int = 256
    scale: float = 1.0
    think_scale: float = 1.0
    jobs: int = 0


def parse_teams(spec: str) -> list[TeamDemand]:
    """``"web:80:1.5,data:40:2"`` -> teams (name, developers, conversations per developer)."""
    teams = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        bits = part.split(":")
        if len(bits) != 3:
            raise ValueError(f"team '{part}': expected NAME:DEVELOPERS:CONVERSATIONS_PER_DEVELOPER")
        try:
            devs, per = int(bits[1]), float(bits[2])
        except ValueError:
            raise ValueError(f"team '{part}': developers must be an integer and conversations a number") from None
        if devs <= 0 or per <= 0 or not bits[0]:
            raise ValueError(f"team '{part}': name, developers and conversations must be given and positive")
        teams.append(TeamDemand(bits[0], devs, per))
    if not teams:
        raise ValueError("no teams given")
    if len({t.name for t in teams}) != len(teams):
        raise ValueError("team names must be unique")
    return teams


# -- one simulated busy hour -----------------------------------------------------------------------


def simulate(
    profile: str,
    servers: int,
    teams: list[tuple[str, int]],
    seed: int,
    minutes: float,
    warmup: float,
    scale: float = 1.0,
    think_scale: float = 1.0,
    config: dict | None = None,
) -> dict:
    """One ``gateway`` run; the row of ``run_one`` plus ``peak_inflight`` per team."""
    from loadtest.results.metrics import summarize, team_rows
    from loadtest.sim.live import validate_config
    from loadtest.sim.simulate import SimConfig, Simulator, build_core, default_engine_factory
    from loadtest.workloads.core import TeamSpec
    from loadtest.workloads.spec import make_workload

    cpu = time.process_time()
    cfg = SimConfig(
        profile=profile,
        backends=servers,
        policy="gateway",
        teams=[TeamSpec(n, c) for n, c in teams],
        minutes=minutes,
        warmup_minutes=warmup,
        seed=seed,
        scale=scale,
        think_scale=think_scale,
    )
    factory = default_engine_factory(cfg)
    engines = {f"b{i}": factory() for i in range(servers)}
    sim = Simulator(
        cfg,
        build_core("gateway", config=config),
        engines,
        make_workload("coding-agent", seed=seed, scale=scale, think_scale=think_scale),
        validate_config(config) if config is not None else None,
    )
    records = sim.run()
    row = summarize(records, sim.warm, sim.end, slots={s.index: s.team for s in sim.slots}, backends=list(engines))
    row.update(
        profile=profile,
        servers=servers,
        seed=seed,
        teams=team_rows(records, sim.warm, sim.end, dict(teams)),
        peak_inflight=_peak_inflight(records, sim.warm, sim.end),
        cpu_s=time.process_time() - cpu,
    )
    return row


def _peak_inflight(records: list, start: float, end: float) -> dict[str, int]:
    """Per team, the most requests sent and not yet finished at any moment of ``[start, end)``."""
    events: dict[str, list[tuple[float, int]]] = {}
    for r in records:
        finish = r.finish if r.finish is not None else end
        if finish < start or r.arrival >= end:
            continue
        ev = events.setdefault(r.team, [])
        ev += [(max(r.arrival, start), 1), (finish, -1)]
    peaks = {}
    for team, ev in events.items():
        ev.sort(key=lambda e: (e[0], e[1]))
        level = peak = 0
        for _, d in ev:
            level += d
            peak = max(peak, level)
        peaks[team] = peak
    return peaks


def _run(args: tuple) -> dict:
    return simulate(*args)


# -- the search ------------------------------------------------------------------------------------


@dataclass
class Point:
    servers: int
    runs: list[dict]
    targets: Targets

    @property
    def meets(self) -> bool:
        return all(not self.targets.misses(r) for r in self.runs)

    def passed(self) -> int:
        return sum(1 for r in self.runs if not self.targets.misses(r))

    def median(self, key: str) -> float | None:
        vals = sorted(r[key] for r in self.runs if r.get(key) is not None)
        return vals[len(vals) // 2] if vals else None

    def worst(self, key: str) -> float | None:
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return max(vals) if vals else None

    def summary(self) -> dict:
        return {
            "servers": self.servers,
            "meets": self.meets,
            "seeds_passed": self.passed(),
            "seeds": len(self.runs),
            "total_tpm": self.median("total_tpm"),
            "ttft_p50_s": self.median("ttft_p50_s"),
            "ttft_p95_s": self.median("ttft_p95_s"),
            "max_wait_s": self.median("max_wait_s"),
            "worst_ttft_p95_s": self.worst("ttft_p95_s"),
            "worst_max_wait_s": self.worst("max_wait_s"),
            "cache_hit_rate": self.median("cache_hit_rate"),
        }


class Planner:
    """Searches one profile at a time; ``pool`` runs the seeds of a fleet in parallel."""

    def __init__(
        self, cfg: PlanConfig, pool: ProcessPoolExecutor | None = None, log: Callable[[str], None] = lambda _m: None
    ) -> None:
        self.cfg = cfg
        self.pool = pool
        self.log = log
        self.teams = [(t.name, t.conversations) for t in cfg.teams]
        self.cpu_s = 0.0

    def evaluate(self, profile: str, servers: int, seeds: tuple[int, ...], config: dict | None = None) -> Point:
        c = self.cfg
        work = [
            (profile, servers, self.teams, s, c.minutes, c.warmup_minutes, c.scale, c.think_scale, config)
            for s in seeds
        ]
        runs = list(self.pool.map(_run, work)) if self.pool else [_run(w) for w in work]
        point = Point(servers, runs, c.targets)
        self.cpu_s += sum(r["cpu_s"] for r in runs)
        self.log(
            f"{profile}: {servers} server(s): {point.passed()}/{len(runs)} seeds meet the targets "
            f"(p50 {point.median('ttft_p50_s')}, p95 {point.median('ttft_p95_s')}, "
            f"wait {point.median('max_wait_s')})"
        )
        return point

    def start(self, profile: str) -> int:
        from backends.sim.profiles import get_profile

        p = get_profile(profile)
        pool = p.kv_tokens * p.dp_size * ADMIT_WATER
        need = sum(n for _, n in self.teams) * MEAN_CONTEXT * self.cfg.scale
        return max(1, min(self.cfg.max_servers, math.ceil(need / pool)))

    def plan(self, profile: str) -> dict:
        t0 = time.perf_counter()
        seen: dict[int, Point] = {}

        def at(n: int) -> Point:
            if n not in seen:
                seen[n] = self.evaluate(
                    profile, n, self.cfg.seeds, config=bound_config(self.cfg.teams, self.cfg.targets)
                )
            return seen[n]

        n = self.start(profile)
        if at(n).meets:
            while n > 1 and at(n - 1).meets:
                n -= 1
            best: int | None = n
        else:
            lo, hi = n, None
            step = max(1, math.ceil(n / 4))  # +25%, then doubling steps
            while hi is None:
                cand = min(self.cfg.max_servers, lo + step)
                if at(cand).meets:
                    hi = cand
                elif cand >= self.cfg.max_servers:
                    break
                else:
                    lo, step = cand, step * 2
            best = None
            if hi is not None:
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if at(mid).meets else (mid, hi)
                best = hi
        out: dict = {"profile": profile, "servers": best, "server": _server_note(profile)}
        if best is not None:
            if best + 1 <= self.cfg.max_servers:
                at(best + 1)
            if best > 1:
                at(best - 1)
            peaks: dict[str, int] = {}
            for r in seen[best].runs:
                for team, v in r["peak_inflight"].items():
                    peaks[team] = max(peaks.get(team, 0), v)
            teams = teams_config(self.cfg.teams, peaks, self.cfg.targets)
            verify = self.evaluate(profile, best, self.cfg.verify_seeds, config={"teams": teams})
            rejected = []
            while not verify.meets and best < self.cfg.max_servers:
                # Met on the search seeds but not on the check's: too close to the edge; the next
                # fleet that meets on both is the recommendation, and the report says so.
                rejected.append({"servers": best, "verify": verify.summary()})
                best += 1
                if not at(best).meets:
                    continue
                verify = self.evaluate(profile, best, self.cfg.verify_seeds, config={"teams": teams})
            if best + 1 <= self.cfg.max_servers:
                at(best + 1)
            out.update(
                servers=best,
                recommended=seen[best].summary(),
                teams=teams,
                verify=verify.summary(),
                rejected=rejected,
                per_team=_per_team(seen[best].runs),
            )
        out["frontier"] = [seen[k].summary() for k in sorted(seen)]
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        out["cpu_s"] = round(self.cpu_s, 1)
        out["simulations"] = sum(len(p.runs) for p in seen.values()) + (len(self.cfg.verify_seeds) if best else 0)
        self.cpu_s = 0.0
        return out


def _per_team(runs: list[dict]) -> dict[str, dict]:
    """Each team on the recommended fleet: median TTFT over seeds, peak in flight over seeds."""
    out: dict[str, dict] = {}
    for team in runs[0]["teams"] if runs else {}:
        rows = [r["teams"][team] for r in runs]
        p50 = sorted(x["ttft_p50_s"] for x in rows if x["ttft_p50_s"] is not None)
        p95 = sorted(x["ttft_p95_s"] for x in rows if x["ttft_p95_s"] is not None)
        out[team] = {
            "ttft_p50_s": p50[len(p50) // 2] if p50 else None,
            "ttft_p95_s": p95[len(p95) // 2] if p95 else None,
            "total_tpm": sorted(x["total_tpm"] for x in rows)[len(rows) // 2],
            "peak_inflight": max(r["peak_inflight"].get(team, 0) for r in runs),
        }
    return out


def _server_note(profile: str) -> str:
    from backends.sim.profiles import get_profile

    p = get_profile(profile)
    if profile.startswith("b300"):
        what = "one 8×B300 node"
    elif profile.startswith("gb10"):
        what = f"one cluster of {p.tp_size * p.pp} GB10 (DGX Spark) nodes"
    else:
        what = "one simulated server"
    ranks = f", {p.dp_size} DP ranks" if p.dp_size > 1 else ""
    return f"{what}{ranks}, {p.kv_tokens * p.dp_size / 1e6:.2f}M tokens of KV"


def run_plan(cfg: PlanConfig, log: Callable[[str], None] = lambda _m: None) -> dict:
    jobs = cfg.jobs or os.cpu_count() or 1
    t0 = time.perf_counter()
    with ProcessPoolExecutor(jobs) as pool:
        planner = Planner(cfg, pool if jobs > 1 else None, log)
        results = [planner.plan(p) for p in cfg.profiles]
    return {
        "teams": [asdict(t) | {"conversations": t.conversations} for t in cfg.teams],
        "targets": asdict(cfg.targets),
        "seeds": list(cfg.seeds),
        "verify_seeds": list(cfg.verify_seeds),
        "minutes": cfg.minutes,
        "warmup_minutes": cfg.warmup_minutes,
        "scale": cfg.scale,
        "profiles": results,
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_average": round(os.getloadavg()[0], 1),
    }
