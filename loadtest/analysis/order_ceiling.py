"""The waiting order's ceiling on a pool-bound engine: how low the p95 TTFT goes when the engine itself
orders its waiting queue, knowing every prompt (a gateway in front knows less and orders less; this is a
ceiling for it), and at what cost in the longest wait (docs/benchmarks.md, "fp8 KV + host cache").

Orders, applied each time the engine forms a prefill batch (``PrefillAdder._policy_order``):

- ``fcfs``: arrival order, SGLang's default.
- ``lpm``: SGLang's longest prefix match first (stable; below 129 waiting).
- ``sjf``: smallest context first (``fill_len``), no bound on a wait.
- ``sjf+age:A``: requests that have waited ``A`` seconds first, in arrival order; the rest smallest first.
- ``mix:K``: rank = context − ``K`` · seconds waited (``K`` tokens of priority per second).

Everything else (pool, chunking, the head that does not fit blocks the queue, load-back from the host
tier) is the engine's own. ``python -m loadtest.analysis.order_ceiling`` prints the table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from backends.sim.engine import Engine, get_profile
from backends.sim.engine_state import RankState, ReqState
from backends.sim.engine_types import EngineRequest
from backends.sim.profile_model import Profile
from loadtest.sim.simulate import SimConfig, run_one

ORDERS = ("fcfs", "lpm", "sjf", "sjf+age:10", "sjf+age:20", "sjf+age:30", "mix:2000", "mix:4000", "mix:8000")


class OrderedEngine(Engine):
    """The simulated engine with its waiting queue ranked by ``order`` (module docstring)."""

    def __init__(self, profile: Profile, order: str, **kwargs: Any) -> None:
        kind, _, arg = order.partition(":")
        if kind not in ("fcfs", "lpm", "sjf", "sjf+age", "mix") or (kind in ("sjf+age", "mix")) != bool(arg):
            raise ValueError(f"unknown order {order!r}")
        super().__init__(profile.with_(schedule_policy="lpm" if kind == "lpm" else "fcfs"), **kwargs)
        self.kind = kind
        self.arg = float(arg or 0)
        self.arrived: dict[str, float] = {}
        self.now = 0.0

    def submit(self, req: EngineRequest, now: float) -> None:
        self.arrived[req.rid] = now
        super().submit(req, now)

    def _start_pass(self, now: float) -> None:
        self.now = now  # the batch is formed at the start of a pass
        super()._start_pass(now)

    def _policy_order(self, rk: RankState) -> list[ReqState]:
        if self.kind in ("fcfs", "lpm"):
            return super()._policy_order(rk)
        now, arrived, arg = self.now, self.arrived, self.arg
        if self.kind == "sjf":
            return sorted(rk.waiting, key=lambda q: q.fill_len)
        if self.kind == "sjf+age":
            return sorted(
                rk.waiting,
                key=lambda q: (0, arrived[q.rid]) if now - arrived[q.rid] >= arg else (1, q.fill_len),
            )
        return sorted(rk.waiting, key=lambda q: q.fill_len - arg * (now - arrived[q.rid]))


def run(order: str, cfg: SimConfig) -> dict[str, Any]:
    """One simulated run of ``cfg`` with the engine ordering its queue by ``order``."""
    profile = get_profile(cfg.profile)
    row = run_one(cfg, engine_factory=lambda: OrderedEngine(profile, order, kv_tokens=cfg.kv_tokens))
    row["order"] = order
    return row


def _run(args: tuple[str, SimConfig]) -> dict[str, Any]:
    return run(*args)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="b300-tp8-fp8-hicache")
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--warmup-minutes", type=float, default=5.0)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--orders", default=",".join(ORDERS))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    jobs = [
        (
            order,
            SimConfig(
                profile=a.profile,
                conversations=a.conversations,
                minutes=a.minutes,
                warmup_minutes=a.warmup_minutes,
                seed=int(seed),
            ),
        )
        for seed in a.seeds.split(",")
        for order in a.orders.split(",")
    ]
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(_run, jobs))
    print(f"{a.profile}, {a.conversations} conversations, {a.minutes:g} min ({a.warmup_minutes:g} warm-up)")
    print("| Order | Seed | Tokens/min | TTFT p50 | TTFT p95 | Longest wait |")
    print("|---|---|---|---|---|---|")
    for (order, cfg), row in zip(jobs, rows, strict=True):
        print(
            f"| `{order}` | {cfg.seed} | {row['total_tpm'] / 1e6:.2f}M | {row['ttft_p50_s']:.2f} s "
            f"| {row['ttft_p95_s']:.2f} s | {row['max_wait_s']:.1f} s |"
        )


if __name__ == "__main__":
    main()
