"""The seated admission core, driven directly with time passed in (no I/O): fairness, team limits,
requeues, replica shares, and the books kept under random events."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.teams import TeamLimits
from policies.types import BackendView, Dispatch, Outcome, Refuse
from tests.policies.admission_helpers import core, dispatched, req


@pytest.mark.slow  # > 5 s here
def test_weighted_fairness_converges_to_weights() -> None:
    """Two saturated teams with weights 1 and 2: tokens served split 1:2 within 5%."""
    c = core(
        teams={
            "a": TeamLimits(weight=1, max_queue=10**6, max_concurrency=10**6),
            "b": TeamLimits(weight=2, max_queue=10**6, max_concurrency=10**6),
        }
    )
    running: dict[str, tuple[str, float]] = {}
    served: Counter[str] = Counter()
    now = 0.0

    def on(decisions: list) -> None:
        for d in dispatched(decisions):
            running[d.rid] = (team_of[d.rid], now + 1.0)

    team_of: dict[str, str] = {}
    for team in ("a", "b"):
        for _ in range(30):
            r = req(team)
            team_of[r.rid] = team
            on(c.arrive(r, now))
    for _ in range(3000):
        now = min(end for _, end in running.values())
        for rid, (team, end) in list(running.items()):
            if end <= now:
                del running[rid]
                served[team] += 1000
                on(c.finish(rid, Outcome(prompt_tokens=900, completion_tokens=100), now))
                r = req(team)  # closed loop: every team always has work waiting
                team_of[r.rid] = team
                on(c.arrive(r, now))
    ratio = served["b"] / served["a"]
    assert abs(ratio - 2.0) / 2.0 < 0.05, ratio


@pytest.mark.slow  # > 5 s here
def test_big_prompts_get_tokens_not_requests() -> None:
    """A team of huge prompts is charged by tokens: it gets equal tokens, so fewer requests."""
    c = core(kv=40_000, teams={t: TeamLimits(max_queue=10**6, max_concurrency=10**6) for t in ("small", "huge")})
    size = {"small": 1_000, "huge": 8_000}
    team_of: dict[str, str] = {}
    running: dict[str, float] = {}
    served: Counter[str] = Counter()
    now = 0.0

    def submit(team: str) -> None:
        r = req(team, tokens=size[team] - 100)
        team_of[r.rid] = team
        for d in dispatched(c.arrive(r, now)):
            running[d.rid] = now + 1.0

    for team in size:
        for _ in range(20):
            submit(team)
    for _ in range(2000):
        now = min(running.values())
        for rid, end in list(running.items()):
            if end <= now:
                del running[rid]
                team = team_of[rid]
                served[team] += size[team]
                for d in dispatched(c.finish(rid, Outcome(prompt_tokens=size[team] - 100, completion_tokens=100), now)):
                    running[d.rid] = now + 1.0
                submit(team)
    assert abs(served["huge"] / served["small"] - 1.0) < 0.1, served


def test_nothing_starves_under_constant_load() -> None:
    """Under saturation every request is dispatched within a bounded wait, large ones included."""
    c = core(
        kv=20_000, teams={t: TeamLimits(max_queue=10**6, max_concurrency=10**6, queue_timeout_s=10**6) for t in "xyz"}
    )
    sizes = {"x": 500, "y": 2_000, "z": 15_000}
    arrived: dict[str, float] = {}
    team_of: dict[str, str] = {}
    running: dict[str, float] = {}
    waits: dict[str, list[float]] = defaultdict(list)
    now = 0.0

    def handle(decisions: list) -> None:
        for d in dispatched(decisions):
            waits[team_of[d.rid]].append(now - arrived[d.rid])
            running[d.rid] = now + 2.0

    def submit(team: str) -> None:
        r = req(team, tokens=sizes[team])
        arrived[r.rid], team_of[r.rid] = now, team
        handle(c.arrive(r, now))

    for team in sizes:
        for _ in range(10):
            submit(team)
    for _ in range(1500):
        now = min(running.values())
        for rid, end in list(running.items()):
            if end <= now:
                del running[rid]
                handle(c.finish(rid, Outcome(), now))
                submit(team_of[rid])
    assert all(waits[t] for t in sizes)
    assert max(max(w) for w in waits.values()) < 200, {t: max(w) for t, w in waits.items()}


def test_priority_band_goes_first() -> None:
    c = core(kv=1_000, teams={"low": TeamLimits(priority=0), "high": TeamLimits(priority=5)})
    first = dispatched(c.arrive(req("low"), 0.0))[0]
    low, high = req("low"), req("high")
    assert not dispatched(c.arrive(low, 0.1)) and not dispatched(c.arrive(high, 0.2))
    nxt = dispatched(c.finish(first.rid, Outcome(), 1.0))
    assert [d.rid for d in nxt] == [high.rid]


def test_queue_bound_and_timeout_refuse_with_retry_after() -> None:
    c = core(kv=1_000, teams={"t": TeamLimits(max_queue=2, queue_timeout_s=5)})
    assert dispatched(c.arrive(req(), 0.0))
    assert c.arrive(req(), 0.0) == [] and c.arrive(req(), 0.0) == []
    refused = c.arrive(req(), 0.0)
    assert len(refused) == 1 and isinstance(refused[0], Refuse)
    assert refused[0].code == "team_queue_full" and refused[0].status == 429
    assert 1.0 <= refused[0].retry_after_s <= 300.0
    expired = [d for d in c.tick(6.0) if isinstance(d, Refuse)]
    assert [d.code for d in expired] == ["queue_timeout", "queue_timeout"]
    assert all(1.0 <= d.retry_after_s <= 300.0 for d in expired)
    assert c.teams["t"].waiting == 0


def test_team_concurrency_cap() -> None:
    c = core(kv=10**9, teams={"t": TeamLimits(max_concurrency=2)})
    got = [dispatched(c.arrive(req(), 0.0)) for _ in range(4)]
    assert [len(g) for g in got] == [1, 1, 0, 0]
    assert len(dispatched(c.finish(got[0][0].rid, Outcome(), 1.0))) == 1


def test_token_rate_refuses_over_budget() -> None:
    c = core(kv=10**9, teams={"t": TeamLimits(tokens_per_minute=3_000)})
    assert dispatched(c.arrive(req(tokens=1_900), 0.0))
    refused = c.arrive(req(tokens=1_900), 1.0)
    assert isinstance(refused[0], Refuse) and refused[0].code == "team_token_rate"
    assert 10 < refused[0].retry_after_s < 60
    assert dispatched(c.arrive(req(tokens=1_900), 60.0))


def test_no_healthy_backend_is_503() -> None:
    c = core()
    c.set_backends("m", [BackendView("b0", healthy=False, kv_tokens=10_000)], 0.0)
    refused = c.arrive(req(), 0.0)
    assert isinstance(refused[0], Refuse) and refused[0].code == "no_healthy_backend" and refused[0].status == 503


def test_requeue_puts_request_back() -> None:
    c = core(kv=10**9)
    r = req()
    d = dispatched(c.arrive(r, 0.0))[0]
    assert c.requeue(d.rid, 0.1) == []
    assert r.rid in c.waiting and c.teams["t"].inflight == 0
    assert not dispatched(c.tick(0.2))  # held off: another replica holds the team's slots
    assert [x.rid for x in dispatched(c.wake("t", 0.3))] == [r.rid]  # a release anywhere wakes it
    d2 = dispatched(c.arrive(req(), 0.4))[0]
    c.requeue(d2.rid, 0.5)
    assert [x.rid for x in dispatched(c.tick(1.6))] == [d2.rid]  # or a second passes


def test_replica_share_splits_limits() -> None:
    c = core(kv=10_000, teams={"t": TeamLimits(max_concurrency=4, max_queue=4)})
    c.set_share(0.5, split_concurrency=True, now=0.0)
    got = [dispatched(c.arrive(req(tokens=400), 0.0)) for _ in range(5)]
    assert [len(g) for g in got] == [1, 1, 0, 0, 0]  # concurrency 4 / 2 replicas
    refused = c.arrive(req(tokens=400), 0.0)
    assert isinstance(refused[0], Refuse) and refused[0].code == "team_queue_full"  # queue 4 / 2
    c.set_share(0.5, split_concurrency=False, now=0.1)  # Redis back: leases enforce concurrency
    assert c.teams["t"].inflight == 4
    big = core(kv=10_000)
    big.set_share(0.5, split_concurrency=False, now=0.0)
    assert dispatched(big.arrive(req(tokens=4_000, out=900), 0.0))
    assert not dispatched(big.arrive(req(tokens=1_000, out=100), 0.0))  # half of 10k budget is used


events = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "finish", "cancel", "tick", "requeue", "retry", "health"]),
        st.integers(0, 30),
        st.integers(100, 6_000),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=120,
)


@settings(max_examples=60, deadline=None)
@given(events)
def test_random_events_keep_the_books(evts: list[tuple[str, int, int, str]]) -> None:
    """Whatever happens, every request ends exactly once and the reservations add up."""
    c = core(
        kv=12_000,
        backends=2,
        teams={
            "a": TeamLimits(max_concurrency=3, max_queue=5, queue_timeout_s=20),
            "b": TeamLimits(weight=2),
            "c": TeamLimits(priority=1),
        },
    )
    now = 0.0
    live: dict[str, str] = {}  # rid -> "waiting" | "running"
    ended: Counter[str] = Counter()

    def apply(decisions: list) -> None:
        for d in decisions:
            assert d.rid in live, d
            if isinstance(d, Dispatch):
                assert live[d.rid] == "waiting"
                live[d.rid] = "running"
            else:
                del live[d.rid]
                ended[d.rid] += 1

    for kind, n, tokens, team in evts:
        now += 0.7
        running = [r for r, s in live.items() if s == "running"]
        waiting = [r for r, s in live.items() if s == "waiting"]
        if kind == "arrive":
            r = req(team, tokens=tokens, conv=f"c{n % 7}" if n % 3 else None)
            live[r.rid] = "waiting"
            apply(c.arrive(r, now))
        elif kind == "finish" and running:
            rid = running[n % len(running)]
            del live[rid]
            ended[rid] += 1
            apply(c.finish(rid, Outcome(prompt_tokens=tokens, completion_tokens=50), now))
        elif kind == "cancel" and waiting:
            rid = waiting[n % len(waiting)]
            del live[rid]
            ended[rid] += 1
            apply(c.cancel(rid, now))
        elif kind == "requeue" and running:
            rid = running[n % len(running)]
            live[rid] = "waiting"
            apply(c.requeue(rid, now))
        elif kind == "retry" and running:
            rid = running[n % len(running)]
            live[rid] = "waiting"
            apply(c.retry(rid, c.running[rid].slot[0], now))
        elif kind == "health":
            apply(
                c.set_backends(
                    "m",
                    [BackendView("b0", healthy=n % 2 == 0, kv_tokens=12_000), BackendView("b1", kv_tokens=12_000)],
                    now,
                )
            )
        else:
            apply(c.tick(now))
        per_slot: Counter[object] = Counter()
        for seat in c.seats.values():
            per_slot[seat.slot] += seat.tokens
        for slot, tokens in c.reserved.items():
            assert tokens == per_slot.get(slot, 0)
            assert tokens >= 0
        seats_per_slot = Counter(seat.slot for seat in c.seats.values())
        assert {s: n for s, n in c.seat_counts.items() if n} == dict(seats_per_slot)
        assert set(c.waiting) == {r for r, s in live.items() if s == "waiting"}
        assert set(c.running) == {r for r, s in live.items() if s == "running"}
        for name, state in c.teams.items():
            assert state.waiting == sum(1 for w in c.waiting.values() if w.req.team == name)
            assert state.inflight == sum(1 for r in c.running.values() if r.waiter.req.team == name)
            assert state.inflight <= state.limits.max_concurrency
    assert all(v == 1 for v in ended.values())
