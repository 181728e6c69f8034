"""What a request will produce, decided up front from its body (deterministic): output length,
reasoning, tool calls, finish reason, and the context-length checks SGLang makes."""

from __future__ import annotations

import json
from typing import Any

from backends.sim.chat_template import assistant_text, content_text
from backends.sim.runtime import ApiError, Plan, Twin, seed_key
from backends.sim.tokenizer import count_tokens, filler_text

TOOL_TRIGGER = "call"
"""A chat request with ``tools`` whose last user message contains the word ``call`` (any case)
answers with one tool call to the first tool (id ``functions.NAME:0``)."""


def plan_request(
    t: Twin,
    prompt_text: str,
    body: dict[str, Any],
    *,
    max_tokens: Any,
    seed: object,
    tool_call: dict[str, Any] | None = None,
    want_reasoning: bool = False,
) -> Plan:
    context = int(t.profile.context_length)
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
    natural = 64 + int(key, 16) % 449  # 64..512 tokens when the client sets no limit
    dp_rank = body.get("routed_dp_rank", body.get("data_parallel_rank"))
    if dp_rank is not None and (
        isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or not 0 <= dp_rank < t.engine.dp_size
    ):
        raise ApiError(f"routed_dp_rank={dp_rank} is out of range [0, {t.engine.dp_size})")
    reasoning_text = ""
    if want_reasoning:
        r = min(budget, max(1, natural // 3))
        reasoning_text = filler_text(seed_key(key, "reasoning"), r)
    room = budget - count_tokens(reasoning_text)
    calls: list[dict[str, Any]] | None = None
    if tool_call is not None:
        calls = [tool_call]
        markup = assistant_text("", calls)
        if count_tokens(markup) <= room:
            n_content = count_tokens(markup)
            content, finish, final = "", "tool_calls", markup
        else:
            calls = None
    if calls is None:
        n_content = min(natural, room) if max_tokens is None else room
        content = filler_text(key, n_content)
        finish = "stop" if max_tokens is None else "length"
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


def tool_call_for(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools")
    if not tools or body.get("tool_choice") == "none":
        return None
    users = [m for m in body.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
    if not users or TOOL_TRIGGER not in content_text(users[-1].get("content")).lower():
        return None
    fn = (tools[0] or {}).get("function") or {}
    name = str(fn.get("name", "tool"))
    props = sorted(((fn.get("parameters") or {}).get("properties") or {}).keys())
    args = json.dumps({p: f"value-{i}" for i, p in enumerate(props)}, sort_keys=True)
    return {"id": f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": args}}
