"""``POST /v1/messages`` (Anthropic Messages, what Claude Code speaks) as a surface on the one
request path.

Parse: the body is translated to chat at once (``translate.messages.to_chat``: Claude Code's
per-request billing header removed), and that chat body is fingerprinted and token-estimated in
both modes. Errors, refusals included, are Anthropic's envelope (``rate_limit_error`` 429 with
``retry-after``, ``overloaded_error`` 503 where a client should back off) with the cachegate
code in header ``x-cachegate-code``; while a streamed request waits in the queue it gets ``ping``
events. Per backend (``Backend.mode("messages", ...)``):

- ``translate``: post ``/v1/chat/completions``, answer built by ``translate.messages`` /
  ``messages_stream`` (``message_start`` on dispatch, ``ping`` on upstream silence);
- ``passthrough``: post the body to the backend's ``/v1/messages`` (model rewritten, billing header
  removed, ``anthropic-version`` / ``anthropic-beta`` forwarded), relayed byte for byte.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.http.errors import GatewayError
from gateway.surfaces.base import ClientRequest, ErrorReply, Surface, Target, UpstreamCall
from gateway.surfaces.native_relay import NativeRelay
from gateway.surfaces.openai import check_shape
from gateway.surfaces.translate import messages as ms
from gateway.surfaces.translate.common import new_id, sse_event
from gateway.surfaces.translate.messages_stream import MessagesStream
from gateway.surfaces.translated_relay import TranslatedRelay

ROUTE = "/v1/messages"
FORWARDED = ("anthropic-version", "anthropic-beta")


class MessagesRun:
    def __init__(self, body: dict[str, Any], chat: ms.MessagesRequest) -> None:
        self.body = body
        self.req = chat
        self.message_id = new_id("msg_")


class MessagesSurface(Surface):
    name = "messages"
    path = ROUTE

    def __init__(self) -> None:
        self.gw: Any = None

    def bind(self, gateway: Any) -> None:
        self.gw = gateway

    def parse(self, raw: bytes) -> ClientRequest:
        body = ms.load_body(raw)
        check_shape(body)  # bounded depth and sizes: a 400, never a 500 (gateway/surfaces/openai.py)
        chat = ms.to_chat(body)
        return ClientRequest(
            model=chat.model,
            stream=chat.stream,
            max_tokens=chat.chat.get("max_tokens"),
            prompt=chat.chat,
            body=body,
            native=MessagesRun(body, chat),
        )

    def error(self, err: GatewayError) -> ErrorReply:
        headers = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        if err.code:
            headers.append((b"x-cachegate-code", err.code.encode()))
        return ErrorReply(err.status, ms.error_body(err.status, err.message, err.code), headers=headers)

    def waiting(self) -> bytes:
        return MessagesStream.ping()

    def stream_error(self, status: int, body: bytes) -> bytes:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = ms.error_envelope(status, body.decode("utf-8", "replace"))
        return sse_event("error", payload)

    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        run = req.native
        assert isinstance(run, MessagesRun)
        backend = self.gw.pool.get(req.model, target.backend)
        if backend.mode(self.name, ROUTE) == "passthrough":
            body = ms.strip_billing_header(dict(run.body))
            body["model"] = target.upstream_model
            if target.rank is not None:  # SGLang's AnthropicMessagesRequest has the PD/DP routing fields
                body["routed_dp_rank"] = target.rank
            headers = {k: req.headers[k] for k in FORWARDED if k in req.headers}
            return UpstreamCall(ROUTE, orjson.dumps(body), NativeRelay("messages", ms.reshape_upstream_error), headers)
        chat = dict(run.req.chat)
        chat["model"] = target.upstream_model
        if target.rank is not None:
            chat["routed_dp_rank"] = target.rank
        return UpstreamCall("/v1/chat/completions", orjson.dumps(chat), self._relay(run, req))

    def _relay(self, run: MessagesRun, req: ClientRequest) -> TranslatedRelay:
        estimate = max(1, round(req.prompt_bytes * self.gw.estimator.ratio))
        stream = MessagesStream(run.req, run.message_id, estimate) if run.req.stream else None

        def whole(status: int, payload: bytes) -> tuple[int, bytes]:
            if status != 200:
                return ms.reshape_upstream_error(status, payload)
            try:
                completion = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return ms.reshape_upstream_error(502, payload)
            return 200, orjson.dumps(ms.from_chat(completion, run.req, run.message_id))

        def fail(message: str) -> bytes:
            return stream.fail(message) if stream is not None else b""

        return TranslatedRelay(stream, whole, MessagesStream.ping(), fail)
