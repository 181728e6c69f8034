"""``backends/aio.py``: ``cancel_and_wait`` cancels background loops and returns only once each has
really stopped (its clean-up has run), skipping the loops that were never started."""

from __future__ import annotations

import asyncio

from backends.aio import cancel_and_wait


async def test_every_task_is_cancelled_and_its_clean_up_has_run_on_return() -> None:
    cleaned: list[str] = []

    async def loop(name: str, cleanup_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(1)
        finally:
            await asyncio.sleep(cleanup_s)  # a clean-up that itself takes a while (closing a connection)
            cleaned.append(name)

    tasks = [asyncio.create_task(loop(n, s)) for n, s in (("slow", 0.05), ("fast", 0.0))]
    await asyncio.sleep(0)  # both running
    await cancel_and_wait([tasks[0], None, tasks[1]])
    assert sorted(cleaned) == ["fast", "slow"]
    assert all(t.cancelled() for t in tasks)


async def test_a_task_that_already_ended_or_swallows_its_cancellation_is_waited_for_quietly() -> None:
    async def done() -> None:
        return None

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            return  # ends normally instead of re-raising

    finished = asyncio.create_task(done())
    await finished
    swallowing = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait([finished, swallowing])
    assert swallowing.done() and not swallowing.cancelled()


async def test_nothing_to_stop() -> None:
    await cancel_and_wait([])
    await cancel_and_wait([None, None])
    await cancel_and_wait(iter([]))
