"""One event sequence through the live dispatcher (gateway/request/dispatch.py, asyncio, in-process) and
through the simulator's driver (loadtest/sim/driver.py): the same decisions, in the same order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.request.dispatch import Dispatcher, Refused
from loadtest.sim.driver import LiveFacts, SimDriver
from policies import registry
from policies.core import DecisionCore
from policies.types import BackendView, Decision, Dispatch, Outcome, RequestFacts

MODEL = "m"
UP = [BackendView("b0", kv_tokens=60_000), BackendView("b1", kv_tokens=60_000, dp_size=2)]
B1_DOWN = [BackendView("b0", kv_tokens=60_000), BackendView("b1", healthy=False, kv_tokens=60_000, dp_size=2)]
PREFIX = [(1000 + i, 512) for i in range(8)]  # a system prompt every conversation shares


def _facts(rid: str, conv: int, turns: int, team: str) -> RequestFacts:
    """A conversation's turn as serve would see it: shared prefix, then the conversation's own blocks."""
    blocks = PREFIX + [(conv * 100_000 + i, 512) for i in range(4 * turns)]
    facts, _ = LiveFacts(max_tokens=1024).facts(rid, MODEL, team, blocks, 300, conversation=None)
    return facts


# (time, event, arguments): arrivals over two teams, a first token, finishes (ok, and a client that
# left mid-stream), a retry after a connection failure, a cancel while waiting, a backend going away,
# a share change, ticks, and a queue timeout.
EVENTS: list[tuple[float, str, tuple[Any, ...]]] = [
    (0.0, "backends", (UP,)),
    *[(0.1 * i, "arrive", (f"r{i}", i % 6, 1 + i % 3, "a" if i % 2 else "b")) for i in range(12)],
    (1.5, "first_token", ("r0",)),
    (2.0, "finish", ("r0", Outcome(ok=True, prompt_tokens=6000, completion_tokens=300, cached_tokens=4000))),
    (2.1, "retry", ("r1",)),
    (2.2, "finish", ("r2", Outcome(ok=False, reached_backend=True))),  # its client left mid-stream
    (2.5, "tick", ()),
    (3.0, "cancel", ("r11",)),
    (4.0, "backends", (B1_DOWN,)),
    (4.5, "finish", ("r3", Outcome(ok=True, prompt_tokens=4000, completion_tokens=200))),
    *[(5.0 + 0.1 * i, "arrive", (f"s{i}", 10 + i, 2, "a")) for i in range(6)],
    (6.0, "tick", ()),
    (7.0, "share", (0.5, False)),
    (8.0, "backends", (UP,)),
    (9.0, "finish", ("r4", Outcome(ok=True, prompt_tokens=9000, completion_tokens=300, cached_tokens=8000))),
    (9.5, "finish", ("r5", Outcome(ok=True, prompt_tokens=9000, completion_tokens=300, cached_tokens=8000))),
    (10.0, "tick", ()),
    (80.0, "tick", ()),  # past the queue timeout of whoever still waits
    (81.0, "finish", ("r1", Outcome(ok=True, prompt_tokens=6000, completion_tokens=300))),
    (82.0, "tick", ()),
    *[
        (85.0, "finish", (rid, Outcome(ok=True, prompt_tokens=6000, completion_tokens=300)))
        for rid in ("r6", "r7", "r8", "r9")
    ],
    (100.0, "tick", ()),  # nobody waits: the dispatcher sends no tick, so idle seats stay
]

CONFIG = {
    "teams": {
        "a": {"max_concurrency": 3, "max_queue": 4, "queue_timeout_s": 60},
        "b": {"max_concurrency": 2, "max_queue": 3, "queue_timeout_s": 60},
    },
    "admission": {"min_hold_s": 1, "idle_release_s": 5},
}


def _core() -> DecisionCore:
    core = registry.build("gateway")
    core.configure(CONFIG)
    return core


def _label(d: Decision) -> tuple[Any, ...]:
    if isinstance(d, Dispatch):
        return (d.rid, "dispatch", d.backend, d.rank, d.reason)
    return (d.rid, "refuse", d.code)


def _backend_of(seen: list[tuple[Any, ...]], rid: str) -> str:
    return next(s[2] for s in reversed(seen) if s[0] == rid and s[1] == "dispatch")


async def _live() -> tuple[list[tuple[Any, ...]], dict[str, object]]:
    clock = [0.0]
    dispatcher = Dispatcher(_core(), clock=lambda: clock[0])
    seen: list[tuple[Any, ...]] = []
    dispatcher.on_decision = lambda d: seen.append(_label(d))
    tasks: dict[str, asyncio.Task[Dispatch]] = {}

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    for t, kind, args in EVENTS:
        clock[0] = t
        if kind == "backends":
            dispatcher.set_backends(MODEL, args[0])
        elif kind == "arrive":
            tasks[args[0]] = asyncio.create_task(dispatcher.admit(_facts(*args)))
        elif kind == "first_token":
            dispatcher.first_token(args[0])
        elif kind == "finish":
            dispatcher.release(args[0], args[1])
        elif kind == "retry":
            dispatcher.retry(args[0], _backend_of(seen, args[0]))
        elif kind == "cancel":
            tasks[args[0]].cancel()
        elif kind == "share":
            dispatcher.set_share(*args)
        elif kind == "tick":
            dispatcher.tick()
        await settle()
    for task in tasks.values():
        task.cancel()
    results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert any(isinstance(r, Refused) for r in results)  # the sequence does reach a refusal
    return seen, dispatcher.core.snapshot()


def _simulated() -> tuple[list[tuple[Any, ...]], dict[str, object]]:
    seen: list[tuple[Any, ...]] = []
    driver = SimDriver(_core(), lambda d, _now: seen.append(_label(d)))
    calls: dict[str, Callable[..., Any]] = {
        "backends": lambda t, views: driver.set_backends(MODEL, views, t),
        "arrive": lambda t, *a: driver.arrive(_facts(*a), t),
        "first_token": lambda t, rid: driver.first_token(rid, t),
        "finish": lambda t, rid, outcome: driver.release(rid, outcome, t),
        "retry": lambda t, rid: driver.retry(rid, _backend_of(seen, rid), t),
        "cancel": lambda t, rid: driver.cancel(rid, t),
        "share": lambda t, share, split: driver.set_share(share, split, t),
        "tick": lambda t: driver.tick(t),
    }
    for t, kind, args in EVENTS:
        calls[kind](t, *args)
    return seen, driver.core.snapshot()


def test_the_live_dispatcher_and_the_simulators_driver_decide_the_same() -> None:
    live, live_state = asyncio.run(_live())
    simulated, simulated_state = _simulated()
    assert simulated == live
    assert simulated_state == live_state  # and the core is left in the same state (seats, queues, teams)
    kinds = {s[1] for s in live} | {s[-1] for s in live}
    # The sequence exercises what it claims: dispatches on both backends and a rank, a retry, refusals.
    assert {"dispatch", "refuse", "retry"} <= kinds
    assert {s[2] for s in live if s[1] == "dispatch"} == {"b0", "b1"}
    assert any(s[3] is not None for s in live if s[1] == "dispatch")
