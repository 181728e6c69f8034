"""The twin speaking vLLM 0.33.0 (``sim-backend --engine vllm``): its own routes, and a middleware that
turns the SGLang-shaped twin into vLLM's dialect at the edge.

Routes (``vllm/entrypoints``): ``GET /health``, ``/metrics`` (``metrics_vllm.py``), ``/version``,
``/load``, ``/v1/models`` (cards with ``max_model_len``), and the client surfaces the SGLang twin
serves (chat, completions, responses, messages: vLLM 0.33 serves all four). No ``/get_server_info``,
``/v1/loads``, ``/generate``: what ``engine: auto`` tells the two engines apart by.

:class:`VllmDialect` does what differs per request:
- the DP rank comes from the header ``X-data-parallel-rank`` (vLLM's ``_get_data_parallel_rank``);
  a body's ``routed_dp_rank`` is an unknown extra field to vLLM, so it is dropped;
- an error answer gets vLLM's envelope ``{"error": {"message", "type", "param", "code"}}`` (``code``
  the HTTP status as an int: ``ErrorInfo`` in ``vllm/entrypoints/serve/engine/protocol.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.sim.httpio import json_response, twin_of_request
from backends.sim.runtime import MAX_MODEL_LEN

VLLM_VERSION = "0.33.0"
RANK_HEADER = b"x-data-parallel-rank"


async def models(request: Request) -> Response:
    t = twin_of_request(request)
    card = {
        "id": t.model,
        "object": "model",
        "created": int(t.startup_time),
        "owned_by": "vllm",
        "root": t.model,
        "parent": None,
        "max_model_len": MAX_MODEL_LEN,
        "permission": [
            {
                "id": "modelperm-twin",
                "object": "model_permission",
                "created": int(t.startup_time),
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return json_response({"object": "list", "data": [card]})


async def version(request: Request) -> Response:
    return json_response({"version": VLLM_VERSION})


async def load(request: Request) -> Response:
    """``/load``: requests in the GPU-using routes (vLLM counts them in its HTTP layer)."""
    return json_response({"server_load": len(twin_of_request(request).live)})


async def metrics(request: Request) -> Response:
    return Response(generate_latest(twin_of_request(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


def error_envelope(body: Any) -> Any:
    """SGLang's flat ``ErrorResponse`` → vLLM's nested one (anything else unchanged)."""
    if isinstance(body, dict) and body.get("object") == "error" and "message" in body:
        return {
            "error": {
                "message": body["message"],
                "type": body.get("type") or "BadRequestError",
                "param": body.get("param"),
                "code": int(body.get("code") or 400),
            }
        }
    return body


class VllmDialect:
    """ASGI middleware: DP rank from vLLM's header, errors in vLLM's envelope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_twin/"):
            await self.app(scope, receive, send)
            return
        if scope["method"] == "POST":
            rank = dict(scope["headers"]).get(RANK_HEADER)
            receive = await _with_rank(receive, rank)
        await self.app(scope, receive, _reshaping(send))


async def _with_rank(receive: Receive, rank: bytes | None) -> Receive:
    """The request body with the header's rank as ``routed_dp_rank`` (the twin's field), then the
    original ``receive`` (so a client that leaves is still seen)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return _replay(b"".join(parts), receive, message)
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    raw = b"".join(parts)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _replay(raw, receive)
    if isinstance(body, dict):
        body.pop("routed_dp_rank", None)
        body.pop("data_parallel_rank", None)
        try:
            if rank is not None:
                body["routed_dp_rank"] = int(rank)
        except ValueError:
            pass  # vLLM ignores a rank that is not an integer
        raw = orjson.dumps(body)
    return _replay(raw, receive)


def _replay(raw: bytes, receive: Receive, pending: Message | None = None) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent, pending
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        if pending is not None:
            message, pending = pending, None
            return message
        return await receive()

    return replay


def _reshaping(send: Send) -> Send:
    """Hold an error answer's head until its body is whole, then send it in vLLM's envelope."""
    held: Message | None = None
    chunks: list[bytes] = []

    async def reshaping(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held = message
            return
        if held is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        raw = b"".join(chunks)
        with contextlib.suppress(orjson.JSONDecodeError):
            raw = orjson.dumps(error_envelope(orjson.loads(raw)))
        headers = [(k, v) for k, v in held["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        await send({**held, "headers": headers})
        await send({"type": "http.response.body", "body": raw, "more_body": False})

    return reshaping
