"""SGLang's OpenAI-compatible routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Streaming: after the first token a handler polls its request every ``stream_interval_s`` wall
seconds and sends the tokens generated since the last chunk, so several tokens may share one SSE
chunk when time-scaled; token counts (usage) are always the engine's exact counts. As in SGLang,
no response byte is sent before the first token (a request that fails validation gets a 400 JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from backends.sim import responses as R
from backends.sim.chat_template import TemplateError
from backends.sim.engine import EngineEvent
from backends.sim.httpio import (
    error_response,
    finish_of,
    json_body,
    json_response,
    max_tokens_of,
    run_plan,
    stream_options,
    twin_of_request,
)
from backends.sim.planner import plan_chat, plan_request
from backends.sim.runtime import MAX_MODEL_LEN, ApiError, Live, Plan, Twin


async def models(request: Request) -> Response:
    t = twin_of_request(request)
    return json_response({"object": "list", "data": [_card(t)]})


def _card(t: Twin) -> dict[str, Any]:
    return {
        "id": t.model,
        "object": "model",
        "created": int(t.startup_time),
        "owned_by": "sglang",
        "root": t.model,
        "parent": None,
        "max_model_len": MAX_MODEL_LEN,
    }


async def model(request: Request) -> Response:
    t = twin_of_request(request)
    name = request.path_params["model"]
    if name != t.model:
        return json_response(
            {
                "error": {
                    "message": f"The model '{name}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            404,
        )
    return json_response(_card(t))


async def chat(request: Request) -> Response:
    t = twin_of_request(request)
    try:
        body = await json_body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(
                "1 validation error for ChatCompletionRequest\nmessages\n  Field required", err_type="Bad Request"
            )
        kwargs = body.get("chat_template_kwargs") or {}
        thinking = bool(kwargs.get("thinking") or kwargs.get("enable_thinking"))
        plan = plan_chat(t, body, max_tokens_of(body, "max_completion_tokens", "max_tokens"), thinking=thinking)
        include_usage, continuous = stream_options(body)
    except TemplateError as e:
        return error_response(ApiError(str(e)))
    except ApiError as e:
        return error_response(e)
    ran = await run_plan(t, request, body, plan)
    if isinstance(ran, Response):
        return ran
    live, rid, model, created, done = ran
    if done is not None:
        return json_response(_chat_final(t, live, plan, done, rid, created, model))
    return StreamingResponse(
        _chat_stream(t, live, plan, rid, created, model, include_usage, continuous), media_type="text/event-stream"
    )


def _chat_final(t: Twin, live: Live, plan: Plan, ev: EngineEvent, rid: str, created: int, model: str) -> dict[str, Any]:
    n = ev.completion_tokens
    r_tokens = min(n, live.reasoning_tokens)
    reasoning = live.reasoning[: 4 * r_tokens] if live.reasoning else None
    content_tokens = n - r_tokens
    finish, matched = finish_of(plan, ev)
    calls = live.tool_calls if finish == "tool_calls" else None
    content = "" if live.tool_calls else live.content[: 4 * content_tokens]
    u = R.usage(
        ev.prompt_tokens or live.prompt_tokens, n, ev.cached_tokens, cache_report=t.cache_report, reasoning=r_tokens
    )
    return R.chat_response(
        rid,
        created,
        model,
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=finish,
        matched_stop=matched,
        usage_=u,
    )


async def _chat_stream(
    t: Twin, live: Live, plan: Plan, rid: str, created: int, model: str, include_usage: bool, continuous: bool
) -> AsyncIterator[bytes]:
    r_tokens = live.reasoning_tokens

    def cont_usage(n: int) -> dict[str, Any] | None:
        if not continuous:
            return None
        return R.usage(live.prompt_tokens, n, live.cached_tokens, cache_report=False, reasoning=min(n, r_tokens))

    def deltas(upto: int) -> list[bytes]:
        out: list[bytes] = []
        lo, hi = live.sent, upto
        if lo >= hi:
            return out
        if lo < r_tokens:
            out.append(
                R.sse(
                    R.chat_chunk(
                        rid,
                        created,
                        model,
                        reasoning=live.reasoning[4 * lo : 4 * min(hi, r_tokens)],
                        usage_=cont_usage(hi),
                    )
                )
            )
        if hi > r_tokens and not live.tool_calls:
            a, b = max(lo, r_tokens) - r_tokens, hi - r_tokens
            out.append(
                R.sse(R.chat_chunk(rid, created, model, content=live.content[4 * a : 4 * b], usage_=cont_usage(hi)))
            )
        live.sent = hi
        return out

    try:
        yield R.sse(R.chat_chunk(rid, created, model, role="assistant", content=""))
        while True:
            if live.done.done():
                break
            for chunk in deltas(t.generated(live)):
                yield chunk
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
        ev = live.done.result()
        for chunk in deltas(ev.completion_tokens):
            yield chunk
        finish, matched = finish_of(plan, ev)
        if finish == "tool_calls" and live.tool_calls:
            yield R.sse(R.chat_tool_call_chunk(rid, created, model, live.tool_calls, cont_usage(ev.completion_tokens)))
        yield R.sse(R.chat_chunk(rid, created, model, finish_reason=finish, matched_stop=matched))
        if include_usage:
            yield R.sse(
                R.chat_usage_chunk(
                    rid,
                    created,
                    model,
                    R.usage(
                        ev.prompt_tokens or live.prompt_tokens,
                        ev.completion_tokens,
                        ev.cached_tokens,
                        cache_report=t.cache_report,
                        reasoning=min(ev.completion_tokens, r_tokens),
                    ),
                )
            )
        yield R.DONE
    finally:
        t.abort_later(rid, t.abort_delay_s)


async def completions(request: Request) -> Response:
    t = twin_of_request(request)
    try:
        body = await json_body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError("The twin supports one string prompt per completion request", err_type="Bad Request")
        plan = plan_request(
            t,
            prompt,
            body,
            max_tokens=max_tokens_of(body, "max_tokens"),
            seed=body.get("seed", ""),
            ignore_eos=bool(body.get("ignore_eos")),
        )
        include_usage, continuous = stream_options(body)
    except ApiError as e:
        return error_response(e)
    ran = await run_plan(t, request, body, plan)
    if isinstance(ran, Response):
        return ran
    live, rid, model, created, ev = ran
    if ev is not None:
        finish, matched = finish_of(plan, ev)
        u = R.usage(
            ev.prompt_tokens or live.prompt_tokens, ev.completion_tokens, ev.cached_tokens, cache_report=t.cache_report
        )
        return json_response(
            R.completion_response(
                rid,
                created,
                model,
                text=live.content[: 4 * ev.completion_tokens],
                finish_reason=finish,
                matched_stop=matched,
                usage_=u,
            )
        )

    async def gen() -> AsyncIterator[bytes]:
        def usage_now(n: int) -> dict[str, Any] | None:
            return R.usage(live.prompt_tokens, n, 0, cache_report=False) if continuous else None

        try:
            while not live.done.done():
                n = t.generated(live)
                if n > live.sent:
                    text = live.content[4 * live.sent : 4 * n]
                    live.sent = n
                    yield R.sse(
                        R.completion_chunk(
                            rid, created, model, text=text, finish_reason=None, matched_stop=None, usage_=usage_now(n)
                        )
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(live.done), t.stream_interval_s)
            ev = live.done.result()
            finish, matched = finish_of(plan, ev)
            text = live.content[4 * live.sent : 4 * ev.completion_tokens]
            live.sent = ev.completion_tokens
            yield R.sse(
                R.completion_chunk(
                    rid,
                    created,
                    model,
                    text=text,
                    finish_reason=finish,
                    matched_stop=matched,
                    usage_=usage_now(ev.completion_tokens),
                )
            )
            if include_usage:
                yield R.sse(
                    R.completion_usage_chunk(
                        rid,
                        created,
                        model,
                        R.usage(
                            ev.prompt_tokens or live.prompt_tokens,
                            ev.completion_tokens,
                            ev.cached_tokens,
                            cache_report=t.cache_report,
                        ),
                    )
                )
            yield R.DONE
        finally:
            t.abort_later(rid, t.abort_delay_s)

    return StreamingResponse(gen(), media_type="text/event-stream")
