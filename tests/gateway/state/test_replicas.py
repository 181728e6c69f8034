"""The shared-state interface (gateway/state/replicas.py): ``MemoryState``, one process without Redis,
serves what ``RedisState`` serves (tests/gateway/state/test_redis_state.py) with every lease granted
and a share of 1."""

from __future__ import annotations

import inspect
from typing import Any

from gateway.state import replicas
from gateway.state.replicas import MemoryState, RedisState


async def test_every_lease_is_granted_and_nothing_is_shared() -> None:
    state = MemoryState()
    await state.start()
    assert (state.degraded, state.replicas, state.shared) == (False, 1, False)
    assert all([await state.acquire("t", f"r{i}", 1) for i in range(5)]), "the core's own counters are exact"
    assert await state.acquire("t", "r9", 0), "even past a limit of 0: the core enforces it, not the state"
    await state.release("t", "r1")
    await state.release("t", "never-held")
    assert state.status() == {"mode": "memory", "replicas": 1}
    await state.stop()


async def test_runtime_limits_are_kept_and_applied_at_once() -> None:
    state = MemoryState()
    await state.set_team("t", {"max_concurrency": 1})  # the default callback: nothing happens
    seen: list[tuple[str, dict[str, Any]]] = []
    state.on_limits = lambda team, fields: seen.append((team, fields))
    await state.set_team("u", {"weight": 2})
    await state.set_team("t", {"max_concurrency": 3})
    assert seen == [("u", {"weight": 2}), ("t", {"max_concurrency": 3})]
    teams = await state.teams()
    assert teams == {"t": {"max_concurrency": 3}, "u": {"weight": 2}}
    teams["v"] = {}
    assert "v" not in await state.teams(), "a copy: the caller cannot change what is kept"


def test_both_states_offer_the_same_interface() -> None:
    assert replicas.__all__ == ["MemoryState", "RedisState"]
    for name in ("start", "stop", "acquire", "release", "set_team", "teams", "status"):
        mine, theirs = getattr(MemoryState, name), getattr(RedisState, name)
        assert inspect.signature(mine).parameters.keys() == inspect.signature(theirs).parameters.keys(), name
        assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(theirs), name
    memory = MemoryState()
    for callback in ("on_wake", "on_limits", "on_share"):
        assert callable(getattr(memory, callback))
    memory.on_wake("t")
    memory.on_share(0.5, True)
