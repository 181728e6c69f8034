"""What a request will produce, decided up front from its body (deterministic): output length,
reasoning, tool calls, finish reason, and the context-length checks SGLang makes.

- Context: every profile serves Kimi's context window, :data:`MAX_MODEL_LEN` tokens, whatever its KV
  size (as a real server started with ``--context-length 262144``); a request is refused only when
  its prompt, or prompt + ``max_tokens``, passes it (SGLang's 400). The engine then clamps the
  output to what its KV pool can hold, as SGLang does.
- Length: an answer's natural length is drawn from the ``coding-agent`` workload's answer
  distribution, log-uniform over 200-1,500 tokens times the twin's answer scale (``--scale``),
  seeded by the request's ``seed`` and prompt. The answer stops there (``finish_reason: stop``);
  only a ``max_tokens`` smaller than that cuts it (``length``). ``ignore_eos: true`` generates
  exactly ``max_tokens``, as on SGLang.
- Tools: see :mod:`backends.sim.agent` (a fresh user turn gets a call on one offered tool, a tool
  result gets text).
"""

from __future__ import annotations

import math
import random
from typing import Any

from backends.sim.agent import choose_tool, tool_call, working_directory
from backends.sim.chat_template import assistant_text, render_chat
from backends.sim.runtime import MAX_MODEL_LEN, ApiError, Plan, Twin, seed_key
from backends.sim.tokenizer import count_tokens, filler_text

ANSWER_TOKENS = (200, 1_500)
"""The ``coding-agent`` workload's answer lengths (``loadtest/workloads/core.py``), before scaling."""


def answer_tokens(key: str, scale: float) -> int:
    """An answer's natural length: log-uniform over :data:`ANSWER_TOKENS`, times ``scale``."""
    lo, hi = ANSWER_TOKENS
    rng = random.Random(key)
    return max(1, round(math.exp(rng.uniform(math.log(lo), math.log(hi))) * scale))


def plan_request(
    t: Twin,
    prompt_text: str,
    body: dict[str, Any],
    *,
    max_tokens: Any,
    seed: object,
    tool_call: dict[str, Any] | None = None,
    want_reasoning: bool = False,
    ignore_eos: bool = False,
) -> Plan:
    context = MAX_MODEL_LEN
    prompt_tokens = count_tokens(prompt_text)
    if prompt_tokens >= context:
        raise ApiError(
            f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context} tokens)."
        )
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ApiError("max_tokens must be a non-negative integer", err_type="Bad Request")
        if prompt_tokens + max_tokens > context:
            raise ApiError(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {prompt_tokens + max_tokens} tokens: {prompt_tokens} tokens from "
                f"the input messages and {max_tokens} tokens for the completion. Please reduce the number "
                f"of tokens in the input messages or the completion to fit within the limit."
            )
        budget = max_tokens
    else:
        budget = context - prompt_tokens
    key = seed_key(seed, prompt_text)
    natural = answer_tokens(key, t.answer_scale)
    cut = max_tokens is not None and (ignore_eos or natural > budget)
    target = budget if cut else natural
    dp_rank = body.get("routed_dp_rank", body.get("data_parallel_rank"))
    if dp_rank is not None and (
        isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or not 0 <= dp_rank < t.engine.dp_size
    ):
        raise ApiError(f"routed_dp_rank={dp_rank} is out of range [0, {t.engine.dp_size})")
    reasoning_text = ""
    if want_reasoning:
        r = min(target, max(1, natural // 3))
        reasoning_text = filler_text(seed_key(key, "reasoning"), r)
    room = target - count_tokens(reasoning_text)
    calls: list[dict[str, Any]] | None = None
    if tool_call is not None:
        calls = [tool_call]
        markup = assistant_text("", calls)
        if count_tokens(markup) <= budget - count_tokens(reasoning_text):
            n_content = count_tokens(markup)
            content, finish, final = "", "tool_calls", markup
        else:
            calls = None
    if calls is None:
        n_content = max(0, room)
        content = filler_text(key, n_content)
        finish = "length" if cut else "stop"
        final = content
    output = count_tokens(reasoning_text) + n_content
    return Plan(
        prompt_text=prompt_text,
        prompt_tokens=prompt_tokens,
        output_tokens=output,
        max_new_tokens=budget,
        reasoning=reasoning_text,
        content=content,
        tool_calls=calls,
        finish_reason=finish,
        final_text=final,
        dp_rank=dp_rank,
    )


def plan_chat(t: Twin, body: dict[str, Any], max_tokens: Any, *, thinking: bool) -> Plan:
    """Plan a chat-shaped request (``messages``, ``tools``, ``tool_choice``; also what the Messages
    and Responses routes convert to). Raises ``TemplateError`` or ``ApiError``."""
    messages = body["messages"]
    tools = body.get("tools")
    prompt = render_chat(messages, tools if isinstance(tools, list) else None)
    return plan_request(
        t,
        prompt,
        body,
        max_tokens=max_tokens,
        seed=body.get("seed", ""),
        tool_call=call_for(tools, body.get("tool_choice", "auto"), messages, prompt),
        want_reasoning=t.reasoning or thinking,
        ignore_eos=bool(body.get("ignore_eos")),
    )


def call_for(tools: Any, tool_choice: Any, messages: list[Any], prompt_text: str) -> dict[str, Any] | None:
    """The tool call that answers this chat turn, or None for a text answer (rules in ``agent``)."""
    if not isinstance(tools, list) or not tools or tool_choice == "none":
        return None
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    if not forced and not _fresh_user_turn(messages):
        return None
    chosen = choose_tool(tools, tool_choice)
    if chosen is None:
        return None
    calls_so_far = sum(
        len(m.get("tool_calls") or []) for m in messages if isinstance(m, dict) and m.get("role") == "assistant"
    )
    return tool_call(chosen[0], chosen[1], calls_so_far, working_directory(prompt_text))


def _fresh_user_turn(messages: list[Any]) -> bool:
    """The conversation ends with the user's message (system messages after it aside) and no tool
    result since the last answer."""
    turn = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
    if not turn or not isinstance(turn[-1], dict) or turn[-1].get("role") != "user":
        return False
    for m in reversed(turn):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "assistant":
            return True
        if role == "tool":
            return False
    return True
