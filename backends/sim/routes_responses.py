"""SGLang's Responses routes: ``POST /v1/responses`` (streamed and not), ``GET /v1/responses/{id}``
and ``POST /v1/responses/{id}/cancel``, answered as SGLang 0.5.23 does for a chat-template model
(Kimi): input items rendered as chat, run like a chat request, output as reasoning, message and
function-call items (:mod:`backends.sim.responses_api`). A stored response (``store``, default
true) can be continued with ``previous_response_id`` on this twin; the store is per process, as
SGLang's is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from backends.sim import responses_api as X
from backends.sim.chat_template import TemplateError
from backends.sim.httpio import error_response, finish_of, json_body, json_response, run_plan, twin_of_request
from backends.sim.planner import plan_chat
from backends.sim.runtime import ApiError, Live, Plan, Twin
from backends.sim.streaming import final_parts, pieces


def _store(request: Request) -> X.Store:
    return request.app.state.responses_store  # type: ignore[no-any-return]


def _error(e: X.ResponsesError) -> Response:
    return json_response(X.error_body(e), e.status)


def _status(finish: str) -> str:
    return {"length": "incomplete", "abort": "cancelled"}.get(finish, "completed")


def _wants_summary(body: dict[str, Any]) -> bool:
    reasoning = body.get("reasoning")
    return isinstance(reasoning, dict) and reasoning.get("summary") is not None


def _thinking(body: dict[str, Any]) -> bool:
    reasoning = body.get("reasoning")
    return isinstance(reasoning, dict) and reasoning.get("effort") not in (None, "none")


def _stored(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if v is not None}


async def create(request: Request) -> Response:
    t = twin_of_request(request)
    store = _store(request)
    try:
        body = await json_body(request)
        history = X.input_history(body, store)
        rid = X.new_id("resp")
        tools = X.chat_tools(body.get("tools"))
        chat: dict[str, Any] = {
            "messages": X.to_messages(body.get("instructions"), history),
            "tools": tools or None,
            "tool_choice": body.get("tool_choice", "auto"),
            "stream": bool(body.get("stream")),
            "model": body.get("model") or t.model,
            "rid": rid,
        }
        for key in ("routed_dp_rank", "data_parallel_rank", "seed"):
            if key in body:
                chat[key] = body[key]
        plan = plan_chat(t, chat, body.get("max_output_tokens"), thinking=_thinking(body))
    except X.ResponsesError as e:
        return _error(e)
    except TemplateError as e:
        return error_response(ApiError(str(e)))
    except ApiError as e:
        return error_response(e)
    ran = await run_plan(t, request, chat, plan)
    if isinstance(ran, Response):
        return ran
    live, rid, model, created, done = ran
    if done is not None:
        finish, _ = finish_of(plan, done)
        output = _output_items(live, done.completion_tokens, finish, body)
        usage = X.usage(
            done.prompt_tokens or live.prompt_tokens, done.completion_tokens, done.cached_tokens,
            min(done.completion_tokens, live.reasoning_tokens),
        )  # fmt: skip
        resp = X.response(body, rid, created, model, output, _status(finish), usage)
        if body.get("store", True):
            store.put(resp, history + [_stored(i) for i in output])
        return json_response(resp)
    stream = _stream(t, store, live, plan, body, history, rid, model, created)
    return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _output_items(live: Live, n: int, finish: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    reasoning, text = final_parts(live, n)
    items: list[dict[str, Any]] = []
    if reasoning:
        items.append(X.reasoning_item(X.new_id("rs"), reasoning, "completed", _wants_summary(body),
                                      X.wants_encrypted_reasoning(body)))  # fmt: skip
    if text:
        items.append(X.message_item(X.new_id("msg"), text, "completed"))
    if finish == "tool_calls":
        for call in live.tool_calls or []:
            fn = call["function"]
            items.append(X.function_call_item(X.new_id("fc", 8), X.new_id("call", 24), fn["name"], fn["arguments"],
                                              "completed"))  # fmt: skip
    return items


async def _stream(
    t: Twin, store: X.Store, live: Live, plan: Plan, body: dict[str, Any], history: list[Any], rid: str,
    model: str, created: int,
) -> AsyncIterator[bytes]:  # fmt: skip
    send = X.EventWriter()
    summary, encrypted = _wants_summary(body), X.wants_encrypted_reasoning(body)
    emitted: list[dict[str, Any]] = []
    index = -1
    open_kind: str | None = None
    item_id, text = "", ""

    def close() -> list[bytes]:
        nonlocal open_kind
        if open_kind is None:
            return []
        at = {"item_id": item_id, "output_index": index}
        if open_kind == "reasoning":
            item = X.reasoning_item(item_id, text, "completed", summary, encrypted)
            if summary:
                out = [send("response.reasoning_summary_text.done", **at, summary_index=0, text=text),
                       send("response.reasoning_summary_part.done", **at, summary_index=0,
                            part={"type": "summary_text", "text": text})]  # fmt: skip
            else:
                out = [send("response.reasoning_text.done", **at, content_index=0, text=text),
                       send("response.content_part.done", **at, content_index=0,
                            part={"type": "reasoning_text", "text": text})]  # fmt: skip
        else:
            item = X.message_item(item_id, text, "completed")
            out = [send("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                   send("response.content_part.done", **at, content_index=0, part=X.output_text(text))]  # fmt: skip
        out.append(send("response.output_item.done", output_index=index, item=item))
        emitted.append(item)
        open_kind = None
        return out

    def open_(kind: str) -> list[bytes]:
        nonlocal open_kind, index, item_id, text
        out = close()
        index += 1
        open_kind, text = kind, ""
        if kind == "reasoning":
            item_id = X.new_id("rs")
            out.append(send("response.output_item.added", output_index=index,
                            item=X.reasoning_item(item_id, "", "in_progress", summary)))  # fmt: skip
            if summary:
                out.append(send("response.reasoning_summary_part.added", item_id=item_id, output_index=index,
                                summary_index=0, part={"type": "summary_text", "text": ""}))  # fmt: skip
            else:
                out.append(send("response.content_part.added", item_id=item_id, output_index=index, content_index=0,
                                part={"type": "reasoning_text", "text": ""}))  # fmt: skip
        else:
            item_id = X.new_id("msg")
            out.append(send("response.output_item.added", output_index=index,
                            item=X.message_item(item_id, "", "in_progress")))  # fmt: skip
            out.append(send("response.content_part.added", output_index=index, item_id=item_id, content_index=0,
                            part=X.output_text("")))  # fmt: skip
        return out

    try:
        initial = X.response(body, rid, created, model, [], "in_progress", None)
        yield send("response.created", response=initial)
        yield send("response.in_progress", response=initial)
        async for kind, piece in pieces(t, live):
            if open_kind != kind:
                for ev in open_(kind):
                    yield ev
            text += piece
            at = {"item_id": item_id, "output_index": index}
            if kind == "reasoning" and summary:
                yield send("response.reasoning_summary_text.delta", **at, summary_index=0, delta=piece)
            elif kind == "reasoning":
                yield send("response.reasoning_text.delta", **at, content_index=0, delta=piece)
            else:
                yield send("response.output_text.delta", content_index=0, output_index=index, item_id=item_id,
                           delta=piece, logprobs=[])  # fmt: skip
        for ev in close():
            yield ev
        done = live.done.result()
        finish, _ = finish_of(plan, done)
        if finish == "tool_calls":
            for call in live.tool_calls or []:
                index += 1
                fn, fc_id, call_id = call["function"], X.new_id("fc", 8), X.new_id("call", 24)
                added = X.function_call_item(fc_id, call_id, fn["name"], "", "in_progress")
                yield send("response.output_item.added", output_index=index, item=added)
                yield send("response.function_call_arguments.delta", item_id=fc_id, output_index=index,
                           delta=fn["arguments"])  # fmt: skip
                yield send("response.function_call_arguments.done", item_id=fc_id, output_index=index,
                           arguments=fn["arguments"], name=fn["name"])  # fmt: skip
                item = X.function_call_item(fc_id, call_id, fn["name"], fn["arguments"], "completed")
                yield send("response.output_item.done", output_index=index, item=item)
                emitted.append(item)
        usage = X.usage(
            done.prompt_tokens or live.prompt_tokens, done.completion_tokens, done.cached_tokens,
            min(done.completion_tokens, live.reasoning_tokens),
        )  # fmt: skip
        final = X.response(body, rid, created, model, emitted, _status(finish), usage)
        if body.get("store", True):
            store.put(final, history + [_stored(i) for i in emitted])
        yield send(f"response.{final['status']}", response=final)
    finally:
        t.abort_later(rid, t.abort_delay_s)


async def retrieve(request: Request) -> Response:
    try:
        return json_response(_store(request).get(request.path_params["response_id"]))
    except X.ResponsesError as e:
        return _error(e)


async def cancel(request: Request) -> Response:
    """Only a background response still queued or running can be cancelled; SGLang returns any
    other (finished) response unchanged."""
    return await retrieve(request)
