"""SGLang's Anthropic routes: ``POST /v1/messages`` (streamed and not) and
``POST /v1/messages/count_tokens``, answered as SGLang 0.5.23 does: the request is converted to a
chat request and run like one, and the result reshaped (:mod:`backends.sim.anthropic`). Errors use
Anthropic's envelope. Query strings (Claude Code's ``?beta=true``) and ``anthropic-*`` headers are
accepted and ignored, as SGLang ignores them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from backends.sim import anthropic as A
from backends.sim.chat_template import TemplateError, render_chat
from backends.sim.httpio import finish_of, json_response, run_plan, twin_of_request
from backends.sim.planner import plan_chat
from backends.sim.runtime import ApiError, Live, Plan, Twin
from backends.sim.streaming import final_parts, pieces
from backends.sim.tokenizer import count_tokens


def _error(message: str, status: int = 400) -> Response:
    return json_response(A.error_body(message, status), status)


async def _body(request: Request) -> dict[str, Any]:
    media = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if media != "application/json":
        raise A.MessagesError("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise A.MessagesError(f"JSON decode error: {e}") from e
    if not isinstance(body, dict):
        raise A.MessagesError("Input should be a valid dictionary")
    return body


async def messages(request: Request) -> Response:
    t = twin_of_request(request)
    try:
        body = await _body(request)
        chat = A.to_chat(body)
        chat["stream"] = bool(body.get("stream"))
        for key in ("rid", "routed_dp_rank", "data_parallel_rank", "seed"):
            if key in body:
                chat[key] = body[key]
        plan = plan_chat(t, chat, chat["max_tokens"], thinking=chat.pop("thinking"))
    except (A.MessagesError, TemplateError) as e:
        return _error(str(e))
    except ApiError as e:
        return _error(e.message, e.status)
    ran = await run_plan(t, request, chat, plan)
    if isinstance(ran, Response):
        if ran.status_code == 499:
            return ran
        return _error(orjson.loads(bytes(ran.body)).get("message", "Request failed"), ran.status_code)
    live, rid, _model, _created, done = ran
    model = str(body["model"])
    if done is not None:
        finish, _ = finish_of(plan, done)
        reasoning, text = final_parts(live, done.completion_tokens)
        usage = A.usage(done.prompt_tokens or live.prompt_tokens, done.cached_tokens, done.completion_tokens)
        calls = live.tool_calls if finish == "tool_calls" else None
        msg = A.message(model, reasoning=reasoning, text=text, tool_calls=calls, finish=finish, usage_=usage)
        return json_response(msg)
    return StreamingResponse(_stream(t, live, plan, rid, model), media_type="text/event-stream")


async def _stream(t: Twin, live: Live, plan: Plan, rid: str, model: str) -> AsyncIterator[bytes]:
    blocks = A.BlockStream()
    try:
        yield A.message_start(f"msg_{rid}", model, A.usage(live.prompt_tokens, live.cached_tokens, 0))
        async for kind, text in pieces(t, live):
            if kind == "reasoning":
                for ev in blocks.ensure("thinking", {"type": "thinking", "thinking": ""}):
                    yield ev
                yield blocks.delta({"type": "thinking_delta", "thinking": text})
            else:
                for ev in blocks.ensure("text", {"type": "text", "text": ""}):
                    yield ev
                yield blocks.delta({"type": "text_delta", "text": text})
        done = live.done.result()
        finish, _ = finish_of(plan, done)
        if finish == "tool_calls":
            for call in live.tool_calls or []:
                for ev in blocks.ensure("tool_use", A.tool_use_block(call, with_input=False), force_new=True):
                    yield ev
                yield blocks.delta({"type": "input_json_delta", "partial_json": call["function"]["arguments"]})
        for ev in blocks.close():
            yield ev
        for ev in A.stream_end(finish, done.completion_tokens):
            yield ev
    finally:
        t.abort_later(rid, t.abort_delay_s)


async def count_tokens_route(request: Request) -> Response:
    try:
        body = await _body(request)
        chat = A.to_chat({"max_tokens": 1, **body})
        tools = chat.get("tools")
        prompt = render_chat(chat["messages"], tools if isinstance(tools, list) else None)
    except (A.MessagesError, TemplateError) as e:
        return _error(str(e))
    return json_response({"input_tokens": count_tokens(prompt)})
