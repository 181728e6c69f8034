"""HTTP plumbing shared by the twin's routes: JSON responses in SGLang's shapes, body checks, and
submitting a plan and waiting for it."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.sim import responses as R
from backends.sim.agent import tool_spec
from backends.sim.engine import EngineEvent
from backends.sim.runtime import ApiError, Plan, Twin


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def error_response(e: ApiError) -> Response:
    return json_response(R.error_body(e.message, e.err_type, e.status), e.status)


def validation_error(message: str) -> Response:
    # RequestValidationError handler: ErrorResponse with type = HTTPStatus.BAD_REQUEST.phrase.
    return json_response(R.error_body(message, "Bad Request", 400), 400)


async def json_body(request: Request) -> dict[str, Any]:
    media = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if media != "application/json":
        raise ApiError(
            "1 validation error:\n  {'loc': ('header', 'content-type'), 'msg': \"Unsupported Media "
            "Type: Only 'application/json' is allowed\", 'type': 'value_error'}",
            err_type="Bad Request",
        )
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise ApiError(f"JSON decode error: {e}", err_type="Bad Request") from e
    if not isinstance(body, dict):
        raise ApiError("Input should be a valid dictionary or object to extract fields from", err_type="Bad Request")
    return body


def stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise ApiError("stream_options must be an object", err_type="Bad Request")
    return bool(so.get("include_usage")), bool(so.get("continuous_usage_stats"))


def max_tokens_of(body: dict[str, Any], *names: str) -> Any:
    for n in names:
        if body.get(n) is not None:
            return body[n]
    return None


def twin_of_request(request: Request) -> Twin:
    return request.app.state.twin  # type: ignore[no-any-return]


async def run_plan(
    t: Twin, request: Request, body: dict[str, Any], plan: Any
) -> tuple[Any, str, str, int, Any] | Response:
    """Submit ``plan`` and wait for its first token, and for a non-streamed request its end:
    ``(live, rid, model, created, finished event or None)``, or the response to send instead."""
    stream = bool(body.get("stream"))
    rid = str(body.get("rid") or uuid.uuid4().hex)
    t.record_trace(rid, request)
    try:
        live = t.submit(rid, plan, stream)
    except ApiError as e:
        return error_response(e)
    fn = (plan.tool_calls or [{}])[0].get("function", {})
    t.requests.append({"rid": rid, "path": request.url.path, "model": body.get("model"), "stream": stream,
                       "prompt_tokens": plan.prompt_tokens, "max_new_tokens": plan.max_new_tokens,
                       "finish": plan.finish_reason, "tool": fn.get("name"), "arguments": fn.get("arguments"),
                       "tools": [spec[0] for spec in map(tool_spec, body.get("tools") or []) if spec]})  # fmt: skip
    model = str(body.get("model") or t.model)
    created = int(time.time())
    if await t.wait_or_disconnect(live.first, live, request) is None:
        return Response(status_code=499)
    done = None
    if not stream:
        done = await t.wait_or_disconnect(live.done, live, request)
        if done is None:
            return Response(status_code=499)
    return live, rid, model, created, done


def finish_of(plan: Plan, ev: EngineEvent) -> tuple[str, int | None]:
    if ev.finish_reason == "abort":
        return "abort", None
    if plan.finish_reason == "stop":
        return "stop", R.KIMI_EOS_TOKEN_ID
    return plan.finish_reason, None
