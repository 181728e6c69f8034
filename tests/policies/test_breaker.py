"""The circuit breaker state machine (pure, time passed in)."""

from __future__ import annotations

from policies.breaker import Breaker


def test_opens_on_a_streak_and_recovers_through_half_open() -> None:
    b = Breaker(consecutive_failures=3, open_s=5.0)
    for t in range(2):
        b.failure(float(t))
    assert b.state(2.0) == "closed" and b.routable(2.0)
    b.failure(2.0)
    assert b.state(2.0) == "open" and not b.routable(2.0)
    assert b.state(6.9) == "open" and b.state(7.0) == "half_open" and not b.routable(7.0)
    b.success(7.5)  # the probe passed
    assert b.state(7.5) == "closed" and b.routable(7.5)


def test_failed_probe_doubles_the_open_time_up_to_the_cap() -> None:
    b = Breaker(open_s=5.0, max_open_s=12.0)
    b.trip(0.0)
    b.failure(5.0)  # half-open probe fails
    assert b.state(14.9) == "open" and b.state(15.0) == "half_open"  # 10 s
    b.failure(15.0)
    assert b.state(26.9) == "open" and b.state(27.0) == "half_open"  # capped at 12 s
    b.success(27.0)
    b.trip(30.0)
    assert b.state(35.0) == "half_open", "a fresh open starts from the base time again"


def test_error_rate_opens_without_a_streak() -> None:
    b = Breaker(consecutive_failures=100, error_rate=0.5, window=10, min_samples=10)
    for i in range(10):
        (b.failure if i % 2 else b.success)(float(i))
    assert b.state(10.0) == "open"


def test_successes_keep_it_closed_and_connection_failure_trips_at_once() -> None:
    b = Breaker()
    for i in range(50):
        b.success(float(i))
        if i % 5 == 0:
            b.failure(float(i))
    assert b.state(50.0) == "closed"
    b.trip(51.0)
    assert b.state(51.0) == "open" and b.trips == 1
