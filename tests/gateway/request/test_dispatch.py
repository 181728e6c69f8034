"""gateway/request/dispatch.py: the dispatcher (the waiting room) in-process: a real decision core, a clock the test
moves; and its team leases through real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.request.dispatch import Dispatcher, Refused
from gateway.state.replicas import RedisState
from policies import registry
from policies.admission import SeatedAdmission
from policies.core import DecisionCore
from policies.routing import RoundRobin
from policies.teams import TeamLimits
from policies.types import BackendView, Dispatch, Outcome, RequestFacts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def seated(**teams: TeamLimits) -> SeatedAdmission:
    return SeatedAdmission(RoundRobin(), teams=teams)


def facts(rid: str, team: str = "t", tokens: int = 1000) -> RequestFacts:
    return RequestFacts(rid=rid, model="m", team=team, prompt_tokens=tokens, max_output_tokens=100)


BACKENDS = [BackendView("b0", kv_tokens=1_000_000), BackendView("b1", kv_tokens=1_000_000)]


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@asynccontextmanager
async def _dispatcher(core: DecisionCore, clock: Clock) -> AsyncIterator[Dispatcher]:
    d = Dispatcher(core, clock=clock, tick_s=0.01)
    d.set_backends("m", BACKENDS)
    d.start()
    try:
        yield d
    finally:
        await d.stop()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_request_the_core_dispatches_at_once_does_not_wait(clock: Clock) -> None:
    async with _dispatcher(registry.build("direct"), clock) as d:
        decision = await asyncio.wait_for(d.admit(facts("r1")), 1)
        assert isinstance(decision, Dispatch) and decision.backend in ("b0", "b1")
        assert d.waiting == 0


async def test_admit_now_gives_the_dispatch_at_once_or_the_future_to_wait_on(clock: Clock) -> None:
    """The request path's two steps: a dispatch given at once comes back without a future; a request
    that must wait gets its future, registered before anything else can run, and ``wait`` on it
    returns the dispatch once another finishes (or raises ``Refused`` for a refusal)."""
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=1))
    async with _dispatcher(core, clock) as d:
        first = d.admit_now(facts("r1"))
        assert isinstance(first, Dispatch) and d.waiting == 0
        second = d.admit_now(facts("r2"))
        assert isinstance(second, asyncio.Future) and not second.done() and d.waiting == 1
        third = d.admit_now(facts("r3"))  # the team's queue is full: refused, through its future
        assert isinstance(third, asyncio.Future) and third.done()
        with pytest.raises(Refused):
            await d.wait(facts("r3"), third)
        waiting = asyncio.create_task(d.wait(facts("r2"), second))
        await _settle()
        assert not waiting.done()
        clock.now = 1.0
        d.release("r1", Outcome(prompt_tokens=1000, completion_tokens=10))
        decision = await asyncio.wait_for(waiting, 1)
        assert isinstance(decision, Dispatch) and decision.rid == "r2" and d.waiting == 0


async def test_a_waiting_request_goes_when_another_of_its_team_finishes(clock: Clock) -> None:
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=4))
    async with _dispatcher(core, clock) as d:
        await d.admit(facts("r1"))
        second = asyncio.create_task(d.admit(facts("r2")))
        await _settle()
        assert not second.done() and d.waiting == 1
        clock.now = 1.0
        d.release("r1", Outcome(prompt_tokens=1000, completion_tokens=10))
        decision = await asyncio.wait_for(second, 1)
        assert decision.rid == "r2" and d.waiting == 0
        assert core.teams["t"].inflight == 1


class Gauge:
    """A gauge child's ``inc``/``dec``, recorded."""

    def __init__(self) -> None:
        self.value = 0.0
        self.moves: list[float] = []

    def inc(self, amount: float = 1) -> None:
        self.value += amount
        self.moves.append(amount)

    def dec(self, amount: float = 1) -> None:
        self.inc(-amount)


async def test_the_queued_gauge_counts_a_request_only_while_it_waits(clock: Clock) -> None:
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=4, queue_timeout_s=5))
    async with _dispatcher(core, clock) as d:
        at_once = Gauge()
        await d.admit(facts("r1"), at_once)
        assert at_once.moves == [], "dispatched at once: never counted"
        waits = Gauge()
        second = asyncio.create_task(d.admit(facts("r2"), waits))
        await _settle()
        assert waits.value == 1
        d.release("r1", Outcome(prompt_tokens=1000, completion_tokens=10))
        await asyncio.wait_for(second, 1)
        assert waits.value == 0 and waits.moves == [1, -1]
        for end in ("cancel", "timeout"):  # every way out of the wait takes the count back
            gauge = Gauge()
            waiting = asyncio.create_task(d.admit(facts(f"r-{end}"), gauge))
            await _settle()
            assert gauge.value == 1
            if end == "cancel":
                waiting.cancel()
            else:
                clock.now += 6.0
            with pytest.raises((asyncio.CancelledError, Refused)):
                await asyncio.wait_for(waiting, 1)
            assert gauge.value == 0, end


async def test_a_refusal_is_raised_with_its_code(clock: Clock) -> None:
    core = seated(t=TeamLimits(max_concurrency=0, max_queue=0))
    async with _dispatcher(core, clock) as d:
        with pytest.raises(Refused) as refused:
            await d.admit(facts("r1"))
        assert refused.value.refusal.code == "team_queue_full" and refused.value.refusal.status == 429


async def test_a_client_that_leaves_while_waiting_gives_its_place_back(clock: Clock) -> None:
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=4))
    async with _dispatcher(core, clock) as d:
        await d.admit(facts("r1"))
        waiting = asyncio.create_task(d.admit(facts("r2")))
        await _settle()
        assert core.teams["t"].waiting == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert core.teams["t"].waiting == 0 and d.waiting == 0
        d.release("r1", Outcome())
        assert core.teams["t"].inflight == 0, "the cancelled request was never dispatched"


async def test_the_tick_loop_times_out_a_long_wait(clock: Clock) -> None:
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=4, queue_timeout_s=5))
    async with _dispatcher(core, clock) as d:
        await d.admit(facts("r1"))
        waiting = asyncio.create_task(d.admit(facts("r2")))
        await _settle()
        clock.now = 6.0  # the ticker (every 10 ms) sees the wait pass the team's timeout
        with pytest.raises(Refused) as refused:
            await asyncio.wait_for(waiting, 1)
        assert refused.value.refusal.code == "queue_timeout"


def _tickers() -> int:
    return sum(1 for t in asyncio.all_tasks() if t.get_name() == "dispatch-tick" and not t.done())


async def test_the_tick_loop_runs_only_while_a_request_waits(clock: Clock) -> None:
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=4, queue_timeout_s=5))
    async with _dispatcher(core, clock) as d:
        await d.admit(facts("r1"))
        await _settle()
        assert _tickers() == 0, "nobody waits: nothing to tick"
        waiting = asyncio.create_task(d.admit(facts("r2")))
        await _settle()
        assert _tickers() == 1 and d.waiting == 1
        d.release("r1", Outcome())
        assert isinstance(await asyncio.wait_for(waiting, 1), Dispatch)
        await asyncio.sleep(0.05)  # the loop's next tick finds nobody waiting and ends
        assert _tickers() == 0
        third = asyncio.create_task(d.admit(facts("r3")))  # a new wait starts it again
        await _settle()
        assert _tickers() == 1
        third.cancel()
        await asyncio.sleep(0.05)
        assert _tickers() == 0 and d.waiting == 0


async def test_a_retry_goes_elsewhere_or_is_refused(clock: Clock) -> None:
    async with _dispatcher(registry.build("direct"), clock) as d:
        first = await d.admit(facts("r1"))
        retry = d.retry("r1", first.backend)
        assert isinstance(retry, Dispatch) and retry.backend != first.backend and retry.reason == "retry"
        again = d.retry("r1", retry.backend)
        assert not isinstance(again, Dispatch) and again.code == "no_healthy_backend"


async def test_a_share_change_reaches_the_core(clock: Clock) -> None:
    core = seated()
    async with _dispatcher(core, clock) as d:
        d.set_share(0.5, True)
        assert core.share == 0.5 and core.split_concurrency


async def test_every_decision_is_seen_by_the_observer(clock: Clock) -> None:
    async with _dispatcher(registry.build("gateway"), clock) as d:
        seen: list[str] = []
        d.on_decision = lambda decision: seen.append(decision.rid)
        await d.admit(facts("r1"))
        assert seen == ["r1"]


@pytest.mark.redis
async def test_a_dispatch_waits_for_its_team_lease_while_another_replica_holds_it(redis_url: str) -> None:
    """Through real Redis: the core dispatches, but the team's one lease is held by another replica, so
    the request is requeued (seen as ``leasing`` meanwhile, never counted in flight) until that replica
    releases; its wake-up brings the request back, the lease is taken, and released with the request."""
    other, mine = RedisState(redis_url, lease_ttl_s=10), RedisState(redis_url, lease_ttl_s=10)
    await other.start()  # the first in an empty Redis
    await mine.start()
    core = seated(t=TeamLimits(max_concurrency=1, max_queue=4))
    d = Dispatcher(core, tick_s=0.01, state=mine)
    mine.on_wake = d.wake
    d.set_backends("m", BACKENDS)
    d.start()
    try:
        assert mine.status()["phase"] == "shared"
        assert await other.acquire("t", "elsewhere", 1)
        first = d.admit_now(facts("r1"))
        assert isinstance(first, asyncio.Future), "a lease to take: never a dispatch at once"
        waiting = asyncio.create_task(d.wait(facts("r1"), first))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if d.waiting == 1 and not d.leasing:
                break
        assert not waiting.done() and d.waiting == 1, "refused by Redis: back in the waiting room"
        assert core.teams["t"].inflight == 0 and core.teams["t"].waiting == 1
        await other.release("t", "elsewhere")
        decision = await asyncio.wait_for(waiting, 3)
        assert decision.rid == "r1" and d.leasing == {} and mine.held == {"r1": "t"}
        d.release("r1", Outcome())
        await asyncio.sleep(0.05)
        assert mine.held == {} and core.teams["t"].inflight == 0
    finally:
        await d.stop()
        await mine.stop()
        await other.stop()
