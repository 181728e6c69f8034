"""``backends/sim/planner.py``: what a request will produce, decided up front from its body: the answer's
natural length (seeded, scaled), where ``max_tokens`` and ``ignore_eos`` cut it, SGLang's context and
argument checks, the DP rank, reasoning, and whether the turn is answered with a tool call."""

from __future__ import annotations

from typing import Any

import pytest

from backends.sim.chat_template import assistant_text, render_chat
from backends.sim.planner import ANSWER_TOKENS, answer_tokens, call_for, plan_chat, plan_request
from backends.sim.runtime import MAX_MODEL_LEN, ApiError, Twin
from backends.sim.server import create_app
from backends.sim.tokenizer import count_tokens


def twin(profile: str = "tiny", **kw: Any) -> Twin:
    return create_app(profile, **kw).state.twin  # type: ignore[no-any-return]


READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "parameters": {"type": "object", "required": ["path"], "properties": {"path": {"type": "string"}}},
    },
}


def test_natural_lengths_are_seeded_log_uniform_and_scaled() -> None:
    lengths = [answer_tokens(f"k{i}", 1.0) for i in range(400)]
    assert all(ANSWER_TOKENS[0] <= n <= ANSWER_TOKENS[1] for n in lengths)
    assert 160 < sum(n < 548 for n in lengths) < 240  # log-uniform: half below the geometric mean √(200 × 1500)
    assert answer_tokens("k1", 1.0) == answer_tokens("k1", 1.0)
    assert abs(answer_tokens("k1", 0.1) - answer_tokens("k1", 1.0) * 0.1) <= 1
    assert answer_tokens("k1", 1e-9) == 1  # never zero


def test_without_max_tokens_the_answer_stops_at_its_natural_length() -> None:
    plan = plan_request(twin(), "hello", {}, max_tokens=None, seed="s")
    assert plan.finish_reason == "stop" and plan.tool_calls is None and plan.reasoning == ""
    assert plan.output_tokens == count_tokens(plan.content)
    assert ANSWER_TOKENS[0] <= plan.output_tokens <= ANSWER_TOKENS[1]
    assert plan.max_new_tokens == MAX_MODEL_LEN - count_tokens("hello") and plan.final_text == plan.content
    again = plan_request(twin(), "hello", {}, max_tokens=None, seed="s")
    assert again.content == plan.content  # deterministic
    other = plan_request(twin(), "hello", {}, max_tokens=None, seed="another")
    assert other.content != plan.content


def test_max_tokens_cuts_only_a_longer_answer_and_ignore_eos_generates_exactly_it() -> None:
    t = twin()
    natural = plan_request(t, "p", {}, max_tokens=None, seed=1).output_tokens
    cut = plan_request(t, "p", {}, max_tokens=natural - 10, seed=1)
    assert (cut.output_tokens, cut.finish_reason) == (natural - 10, "length")
    roomy = plan_request(t, "p", {}, max_tokens=natural + 10, seed=1)
    assert (roomy.output_tokens, roomy.finish_reason, roomy.max_new_tokens) == (natural, "stop", natural + 10)
    forced = plan_request(t, "p", {}, max_tokens=natural + 10, seed=1, ignore_eos=True)
    assert (forced.output_tokens, forced.finish_reason) == (natural + 10, "length")
    assert plan_request(twin(answer_scale=0.01), "p", {}, max_tokens=None, seed=1).output_tokens < 20


@pytest.mark.parametrize("bad", [True, -1, 1.5, "5"])
def test_max_tokens_must_be_a_non_negative_integer(bad: Any) -> None:
    with pytest.raises(ApiError) as err:
        plan_request(twin(), "p", {}, max_tokens=bad, seed=1)
    assert err.value.status == 400 and err.value.err_type == "Bad Request"


def test_the_context_window_refuses_as_sglang_does() -> None:
    t = twin()
    with pytest.raises(ApiError, match=r"The input \(262144 tokens\) is longer than the model's context length"):
        plan_request(t, "x" * 4 * MAX_MODEL_LEN, {}, max_tokens=None, seed=1)
    with pytest.raises(ApiError, match="You requested a total of 262145 tokens: 1 tokens from the input"):
        plan_request(t, "x", {}, max_tokens=MAX_MODEL_LEN, seed=1)
    assert plan_request(t, "x", {}, max_tokens=MAX_MODEL_LEN - 1, seed=1).max_new_tokens == MAX_MODEL_LEN - 1


def test_the_dp_rank_is_read_from_either_field_and_checked() -> None:
    dp = twin("b300-dp2-bf16")
    assert plan_request(dp, "p", {"routed_dp_rank": 1}, max_tokens=5, seed=1).dp_rank == 1
    assert plan_request(dp, "p", {"data_parallel_rank": 0}, max_tokens=5, seed=1).dp_rank == 0
    assert plan_request(dp, "p", {}, max_tokens=5, seed=1).dp_rank is None
    for bad in (2, -1, True, "1"):
        with pytest.raises(ApiError, match=r"out of range \[0, 2\)"):
            plan_request(dp, "p", {"routed_dp_rank": bad}, max_tokens=5, seed=1)


def test_reasoning_takes_about_a_third_of_the_answer_and_the_total_is_unchanged() -> None:
    t = twin()
    plain = plan_request(t, "p", {}, max_tokens=None, seed=3)
    thinking = plan_request(t, "p", {}, max_tokens=None, seed=3, want_reasoning=True)
    r = count_tokens(thinking.reasoning)
    assert r == max(1, plain.output_tokens // 3) and thinking.output_tokens == plain.output_tokens
    assert count_tokens(thinking.content) == plain.output_tokens - r


def test_a_tool_call_is_the_answer_when_its_markup_fits_else_text() -> None:
    call = {"id": "functions.read_file:0", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    plan = plan_request(twin(), "p", {}, max_tokens=None, seed=1, tool_call=call)
    assert (plan.finish_reason, plan.content, plan.tool_calls) == ("tool_calls", "", [call])
    assert plan.final_text == assistant_text("", [call]) and plan.output_tokens == count_tokens(plan.final_text)
    tight = plan_request(twin(), "p", {}, max_tokens=3, seed=1, tool_call=call)
    assert tight.tool_calls is None and tight.finish_reason == "length" and tight.output_tokens == 3


def test_a_fresh_user_turn_with_tools_gets_a_call_and_a_tool_result_gets_text() -> None:
    t = twin()
    first = [{"role": "user", "content": "what is in the repo?"}, {"role": "system", "content": "late"}]
    plan = plan_chat(t, {"messages": first, "tools": [READ]}, None, thinking=False)
    assert plan.finish_reason == "tool_calls" and plan.tool_calls is not None
    assert plan.tool_calls[0]["id"] == "functions.read_file:0"
    assert plan.prompt_text == render_chat(first, [READ])
    answered = [
        *first,
        {"role": "assistant", "content": "", "tool_calls": plan.tool_calls},
        {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "README.md"},
    ]
    text = plan_chat(t, {"messages": answered, "tools": [READ]}, None, thinking=False)
    assert text.tool_calls is None and text.finish_reason == "stop"
    forced = plan_chat(t, {"messages": answered, "tools": [READ], "tool_choice": "required"}, None, thinking=True)
    assert forced.tool_calls is not None and forced.tool_calls[0]["id"] == "functions.read_file:1"  # the 2nd call
    assert forced.reasoning != ""
    none = plan_chat(t, {"messages": first, "tools": [READ], "tool_choice": "none"}, None, thinking=False)
    assert none.tool_calls is None


def test_which_turns_call_a_tool() -> None:
    user = {"role": "user", "content": "go"}
    assert call_for([READ], "auto", [user], "") is not None
    assert call_for([], "auto", [user], "") is None and call_for(None, "auto", [user], "") is None
    assert call_for([READ], "auto", [user, {"role": "assistant", "content": "done"}], "") is None
    assert call_for([READ], "auto", [{"role": "system", "content": "s"}], "") is None  # no user turn
    named = {"type": "function", "function": {"name": "read_file"}}
    assert call_for([READ], named, [user, {"role": "assistant", "content": "x"}], "") is not None
    assert call_for([READ], {"type": "function", "function": {"name": "missing"}}, [user], "") is None
    call = call_for([READ], "auto", [user], "Working directory: /srv/app\n")
    assert call is not None and call["function"]["arguments"] == '{"path": "README.md"}'
