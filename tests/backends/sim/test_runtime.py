"""backends/sim/runtime.py: the :class:`Twin` (engine + wall clock + requests in flight) driven directly,
without HTTP: its clock, submit and the events it hands back, abort (now and later), a client that
leaves, trace records, an engine that fails, and ``tp_size`` / ``seed_key``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from backends.sim.engine import Engine, EngineEvent
from backends.sim.profiles import get_profile
from backends.sim.runtime import ApiError, Plan, Twin, seed_key, tp_size
from backends.sim.tokenizer import filler_text
from tests.backends.sim.twin_asgi import asgi_request

LABELS = {"model_name": "m", "engine_type": "unified"}


def _twin(engine: Any = None, **kw: Any) -> Twin:
    prof = get_profile("tiny")
    args: dict[str, Any] = {
        "profile": prof,
        "model": "m",
        "time_scale": 0.02,
        "cache_report": True,
        "abort_delay_s": 0.05,
        "stream_interval_s": 0.005,
        "reasoning": False,
        "startup_delay_s": 0.0,
    }
    args.update(kw)
    return Twin(engine or Engine(prof), **args)


@asynccontextmanager
async def started(twin: Twin) -> AsyncIterator[Twin]:
    await twin.start()
    try:
        yield twin
    finally:
        await twin.stop()


def _plan(output: int = 20, prompt: str = "def parse(x):\n" * 40, finish: str = "length") -> Plan:
    content = filler_text("content", output)
    return Plan(
        prompt_text=prompt,
        prompt_tokens=len(prompt.encode()) // 4,
        output_tokens=output,
        max_new_tokens=output,
        reasoning="",
        content=content,
        tool_calls=None,
        finish_reason=finish,
        final_text=content,
    )


def test_a_time_scale_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="time_scale"):
        _twin(time_scale=0)


async def test_the_clock_runs_one_engine_second_per_time_scale_wall_seconds() -> None:
    async with started(_twin(time_scale=0.01)) as t:
        await asyncio.sleep(0.05)
        assert t.now() >= 5.0  # 0.05 wall s at 0.01 wall s per engine s


async def test_a_submitted_request_gets_its_first_token_then_finishes_with_its_planned_length() -> None:
    async with started(_twin()) as t:
        live = t.submit("r1", _plan(output=20), stream=False)
        assert t.live == {"r1": live} and t.max_live == 1
        first = await asyncio.wait_for(live.first, 5)
        done = await asyncio.wait_for(live.done, 5)
        assert first.kind == "first_token" and done.kind == "finished"
        assert done.completion_tokens == 20 and done.finish_reason == "length"
        assert live.first_time is not None and live.first_time <= done.time
        assert "r1" not in t.live and t.generated(live) == 20
        reg = t.metrics.registry
        assert reg.get_sample_value("sglang:num_requests_total", {**LABELS, "is_streaming": "false"}) == 1
        assert reg.get_sample_value("sglang:generation_tokens_total", {**LABELS, "is_streaming": "false"}) == 20


async def test_a_duplicate_request_id_is_refused_while_the_first_runs() -> None:
    async with started(_twin()) as t:
        t.submit("dup", _plan(output=2000), stream=True)
        with pytest.raises(ApiError, match="Duplicate request ID: dup"):
            t.submit("dup", _plan(), stream=True)
        assert t.abort("dup")


async def test_abort_ends_a_running_request_with_finish_abort_and_counts_it() -> None:
    async with started(_twin()) as t:
        assert t.abort("nobody") is False
        live = t.submit("long", _plan(output=5000), stream=True)
        await asyncio.wait_for(live.first, 5)
        assert t.abort("long") is True
        done = live.done.result()
        assert done.finish_reason == "abort" and done.completion_tokens < 5000
        assert "long" not in t.live and t.abort("long") is False
        assert t.metrics.registry.get_sample_value("sglang:num_aborted_requests_total", LABELS) == 1


async def test_abort_later_fires_after_its_delay_and_is_a_no_op_for_an_unknown_request() -> None:
    async with started(_twin()) as t:
        t.abort_later("nobody", 0.01)
        assert not t._timers
        live = t.submit("later", _plan(output=5000), stream=True)
        t.abort_later("later", 0.05)
        assert not live.done.done()
        done = await asyncio.wait_for(live.done, 5)
        assert done.finish_reason == "abort" and not t._timers


async def test_a_client_that_leaves_while_waiting_aborts_its_request() -> None:
    async with started(_twin(abort_delay_s=0.01)) as t:  # polls the client every 0.05 s
        live = t.submit("left", _plan(output=5000), stream=False)
        got = await asyncio.wait_for(t.wait_or_disconnect(live.done, live, asgi_request(disconnected=True)), 5)
        assert got is None and live.done.result().finish_reason == "abort"
        kept = t.submit("kept", _plan(output=10), stream=False)
        ev = await asyncio.wait_for(t.wait_or_disconnect(kept.done, kept, asgi_request()), 5)
        assert ev is not None and ev.completion_tokens == 10


async def test_the_twin_is_unready_while_starting_then_ready() -> None:
    async with started(_twin(startup_delay_s=0.05)) as t:
        assert t.ready is False
        await asyncio.sleep(0.1)
        assert t.ready is True


async def test_stop_right_after_a_wake_up_still_stops_the_driver() -> None:
    for _ in range(5):  # the driver must have just entered wait_for: most attempts hit it, one is enough
        t = _twin()
        await t.start()
        live = t.submit("r", _plan(output=5000), stream=True)
        await asyncio.wait_for(live.first, 5)  # the driver set it, then went back into wait_for
        t.abort("r")  # wakes it (_poke) ...
        stopping = asyncio.ensure_future(t.stop())  # ... and stop() cancels it in the same step
        done, _ = await asyncio.wait({stopping}, timeout=0.3)
        if not done:  # clean up: a second cancel reaches the driver where it now waits
            assert t._driver is not None
            t._driver.cancel()
            await asyncio.wait({stopping}, timeout=1.0)
        assert done, "Twin.stop() did not return: the driver swallowed its cancellation"


class _Breaks(Engine):
    broken = False

    def advance(self, until: float) -> list[EngineEvent]:
        if self.broken:
            raise RuntimeError("boom")
        return super().advance(until)


async def test_an_engine_that_fails_makes_the_twin_unhealthy_and_fails_its_requests() -> None:
    engine = _Breaks(get_profile("tiny"))
    async with started(_twin(engine)) as t:
        live = t.submit("doomed", _plan(output=50), stream=True)
        engine.broken = True
        t._poke()
        with pytest.raises(RuntimeError, match="engine failed"):
            await asyncio.wait_for(live.first, 5)
        assert t.ready is False and isinstance(t.failed, RuntimeError)


def test_trace_headers_are_recorded_per_request_and_bounded() -> None:
    t = _twin()
    t.record_trace("none", asgi_request())
    assert t.last_trace["rid"] is None and not t.traceparents
    for i in range(1030):
        t.record_trace(f"r{i}", asgi_request(headers={"traceparent": f"00-{i:032x}-{i:016x}-01"}))
    assert len(t.traceparents) == 1024 and "r0" not in t.traceparents and "r6" in t.traceparents
    assert t.last_trace == {"rid": "r1029", "traceparent": f"00-{1029:032x}-{1029:016x}-01", "tracestate": None}


async def test_loads_are_one_per_rank() -> None:
    prof = get_profile("b300-dp8-fp8")
    async with started(_twin(Engine(prof), profile=prof)) as t:
        t.submit("pinned", replace(_plan(output=3000), dp_rank=5), stream=True)
        loads = t.loads()
        assert [ld.dp_rank for ld in loads] == list(range(8))
        assert [ld.num_running_reqs + ld.num_waiting_reqs for ld in loads] == [0, 0, 0, 0, 0, 1, 0, 0]
        t.abort("pinned")


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        (SimpleNamespace(tp_size=4, name="b300-dp8"), 4),
        (SimpleNamespace(tp_size=None, name="b300-dp8-fp8"), 8),
        (SimpleNamespace(name="gb10-tp2"), 2),
        (SimpleNamespace(name="tiny"), 1),
    ],
)
def test_tp_size_is_the_profiles_own_or_read_from_its_name(profile: Any, expected: int) -> None:
    assert tp_size(profile) == expected


def test_seed_key_is_deterministic_and_separates_its_parts() -> None:
    assert seed_key("a", 1) == seed_key("a", 1)
    assert len(seed_key("a")) == 16
    assert seed_key("ab", "c") != seed_key("a", "bc")
    assert seed_key("a", 1) != seed_key("a", 2)
