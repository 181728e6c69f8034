"""backends/sim/streaming.py: a request's output cut into reasoning and content pieces (what the
Messages and Responses surfaces reshape): the final parts of an answer cut short or ending in a
tool call, pieces that never overlap or repeat, and pieces from a live twin adding up to the answer."""

from __future__ import annotations

import asyncio
from typing import Any

from backends.sim.planner import plan_chat
from backends.sim.runtime import Live
from backends.sim.server import create_app
from backends.sim.streaming import _cut, final_parts, pieces
from tests.backends.sim.twin_asgi import USER

REASONING = "r" * 40  # 10 tokens
CONTENT = "c" * 80  # 20 tokens


def _live(reasoning: str = REASONING, content: str = CONTENT, tool_calls: Any = None) -> Live:
    loop = asyncio.new_event_loop()
    try:
        return Live(
            "rid", 10, 30, reasoning, content, tool_calls, True, 0.0, loop.create_future(), loop.create_future()
        )
    finally:
        loop.close()


def test_final_parts_of_a_whole_answer_and_of_one_cut_inside_its_reasoning() -> None:
    live = _live()
    assert final_parts(live, 30) == (REASONING, CONTENT)
    assert final_parts(live, 14) == (REASONING, "c" * 16)
    assert final_parts(live, 4) == ("r" * 16, "")
    assert final_parts(_live(reasoning=""), 5) == (None, "c" * 20)


def test_a_tool_call_answer_has_no_content_text() -> None:
    calls = [{"id": "functions.read:0", "function": {"name": "read", "arguments": "{}"}}]
    assert final_parts(_live(tool_calls=calls), 30) == (REASONING, "")
    live = _live(tool_calls=calls)
    assert _cut(live, 30) == [("reasoning", REASONING)]


def test_cut_hands_out_each_token_once_across_the_reasoning_to_content_boundary() -> None:
    live = _live()
    assert _cut(live, 0) == []
    assert _cut(live, 6) == [("reasoning", "r" * 24)]
    assert _cut(live, 13) == [("reasoning", "r" * 16), ("content", "c" * 12)]
    assert live.sent == 13
    assert _cut(live, 13) == [] and _cut(live, 12) == []  # nothing new, nothing twice
    assert _cut(live, 30) == [("content", "c" * 68)]


async def test_pieces_follow_a_running_request_and_add_up_to_its_final_parts() -> None:
    app = create_app("tiny", time_scale=0.02, stream_interval_s=0.002, abort_delay_s=0.01)
    t = app.state.twin
    await t.start()
    try:
        body = {"messages": USER, "max_tokens": 300, "ignore_eos": True}
        live = t.submit("p1", plan_chat(t, body, 300, thinking=True), stream=True)
        got = [piece async for piece in pieces(t, live)]
        n = live.done.result().completion_tokens
        assert n == 300 and len(got) > 2  # several polls, not one piece at the end
        kinds = [k for k, _ in got]
        assert kinds == sorted(kinds, key=lambda k: k != "reasoning")  # reasoning first, then content
        reasoning = "".join(p for k, p in got if k == "reasoning")
        content = "".join(p for k, p in got if k == "content")
        assert (reasoning, content) == final_parts(live, n) and reasoning
    finally:
        await asyncio.sleep(0.01)
        await t.stop()
