"""``POST /v1/responses`` (OpenAI Responses) as a surface on the one request path.

Parse: the body is translated to chat at once (``translate.responses.to_chat``), after
``previous_response_id`` is resolved through the response store (absent, expired or another
team's → 404 ``previous_response_not_found``); the translated chat body is what is fingerprinted
and token-estimated, in both modes, so a Responses conversation is routed like a chat one.

Per backend (``Backend.mode("responses", ...)``):

- ``translate``: post ``/v1/chat/completions``; the answer becomes Responses objects and events
  (``translate.responses`` / ``responses_stream``);
- ``passthrough``: post the client's body to the backend's ``/v1/responses`` (model rewritten, and a
  ``previous_response_id`` expanded into the stored items, so a follow-up works on any backend and
  any replica sharing Redis); relayed byte for byte (``gateway/surfaces/native_relay.py``).

Either way the final Response is stored (``in_progress`` first when translated and streamed), for
follow-ups, ``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``; a cancel of a stream
running on this replica ends it with ``response.failed`` and closes its upstream.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.http.errors import GatewayError
from gateway.surfaces.base import ClientRequest, Surface, Target, UpstreamCall
from gateway.surfaces.native_relay import NativeRelay
from gateway.surfaces.openai import check_shape
from gateway.surfaces.response_store import MemoryResponseStore, RedisResponseStore, ResponseStore, StoredResponse
from gateway.surfaces.translate import responses as rs
from gateway.surfaces.translate.common import new_id, read_upstream_error, sse_event
from gateway.surfaces.translate.responses_stream import ResponsesStream, keepalive
from gateway.surfaces.translated_relay import TranslatedRelay

ROUTE = "/v1/responses"


class ResponsesRun:
    """One Responses request as parsed: its body, translation, id and team."""

    def __init__(
        self, body: dict[str, Any], chat: rs.ResponsesRequest, team: str, prior: list[dict[str, Any]] | None
    ) -> None:
        self.body = body
        self.req = chat
        self.team = team
        self.prior = prior
        self.response_id = rs_id()
        self.created_at = float(int(time.time()))
        self.relay: TranslatedRelay | None = None
        self.final: dict[str, Any] | None = None


def rs_id() -> str:
    return new_id("resp_")


class ResponsesSurface(Surface):
    name = "responses"
    path = ROUTE

    def __init__(self) -> None:
        self.gw: Any = None
        self.store: ResponseStore = MemoryResponseStore()
        self.running: dict[str, ResponsesRun] = {}

    def bind(self, gateway: Any) -> None:
        self.gw = gateway
        url = gateway.config.redis_url
        self.store = RedisResponseStore.from_url(url) if url else MemoryResponseStore()
        gateway.responses = self

    async def close(self) -> None:
        await self.store.close()

    def stream_error(self, status: int, body: bytes) -> bytes:
        """The Responses stream's own ``error`` event (what the SDKs raise from), once opened."""
        err = read_upstream_error(status, body)
        return sse_event(
            "error",
            {"type": "error", "code": err.code, "message": err.message, "param": err.param, "sequence_number": 0},
        )

    def parse(self, raw: bytes) -> ClientRequest:
        body = rs.load_body(raw)
        check_shape(body)  # bounded depth and sizes: a 400, never a 500 (gateway/surfaces/openai.py)
        chat = rs.to_chat(body)  # checks the body; redone in prepare with the prior items
        max_out = chat.chat.get("max_tokens")
        return ClientRequest(
            model=chat.model, stream=chat.stream, max_tokens=max_out, prompt=chat.chat, body=body, native=body
        )

    async def prepare(self, req: ClientRequest) -> None:
        body = req.native
        assert isinstance(body, dict)
        prior = None
        previous = rs.previous_response_id(body)
        if previous is not None:
            record = await self.store.get(previous, req.team)
            if record is None:
                raise GatewayError(
                    404,
                    f"Previous response with id '{previous}' not found.",
                    "previous_response_not_found",
                    "previous_response_id",
                )
            prior = record.conversation()
        chat = rs.to_chat(body, prior)
        req.prompt = chat.chat
        req.native = ResponsesRun(body, chat, req.team, prior)

    def upstream(self, req: ClientRequest, target: Target) -> UpstreamCall:
        run = req.native
        assert isinstance(run, ResponsesRun)
        backend = self.gw.pool.get(req.model, target.backend)
        if backend.mode(self.name, ROUTE) == "passthrough":
            body = dict(run.body)
            body["model"] = target.upstream_model
            if run.prior is not None:  # the backend may not hold it: send the whole conversation
                body.pop("previous_response_id", None)
                body["input"] = run.req.input_items
            if target.rank is not None:
                body["routed_dp_rank"] = target.rank

            async def stored(final: dict[str, Any] | None, ok: bool) -> None:
                if final is not None and run.req.store and isinstance(final.get("id"), str):
                    await self._put(run, final["id"], final)

            return UpstreamCall(ROUTE, orjson.dumps(body), NativeRelay("responses", _reshape, stored))
        chat = dict(run.req.chat)
        chat["model"] = target.upstream_model
        if target.rank is not None:
            chat["routed_dp_rank"] = target.rank
        return UpstreamCall("/v1/chat/completions", orjson.dumps(chat), self._relay(run))

    def _relay(self, run: ResponsesRun) -> TranslatedRelay:
        stream = ResponsesStream(run.req, run.response_id, run.created_at) if run.req.stream else None

        def whole(status: int, payload: bytes) -> tuple[int, bytes]:
            if status != 200:
                return rs.reshape_upstream_error(status, payload)
            try:
                completion = orjson.loads(payload)
            except orjson.JSONDecodeError:
                return rs.reshape_upstream_error(502, payload)
            final = rs.from_chat(completion, run.req, run.response_id, run.created_at)
            run.final = final
            return 200, orjson.dumps(final)

        def fail(message: str) -> bytes:
            return stream.fail(message) if stream is not None else b""

        def cancelled() -> bytes:
            return stream.fail("The response was cancelled.", "cancelled") if stream is not None else b""

        async def done(ok: bool) -> None:
            self.running.pop(run.response_id, None)
            final = stream.response if stream is not None else run.final
            if final is not None and run.req.store:
                cancelled_now = relay.cancel_requested
                await self._put(run, run.response_id, final, "cancelled" if cancelled_now else None)

        relay = TranslatedRelay(stream, whole, keepalive(), fail, done, cancelled, lambda: self.started(run))
        run.relay = relay
        if stream is not None:
            self.running[run.response_id] = run
        return relay

    async def _put(
        self, run: ResponsesRun, response_id: str, response: dict[str, Any], status: str | None = None
    ) -> None:
        await self.store.put(
            StoredResponse(
                response_id,
                run.team,
                run.req.model,
                status or str(response.get("status") or "completed"),
                run.created_at,
                run.req.input_items,
                response,
            )
        )

    async def started(self, run: ResponsesRun) -> None:
        """Store the in-progress Response of a translated stream (GET and cancel see it)."""
        if run.req.store:
            await self._put(
                run, run.response_id, rs.response_object(run.req, run.response_id, run.created_at, "in_progress", [])
            )

    def cancel_local(self, response_id: str) -> bool:
        """Stop a stream running on this replica: its relay ends it and its upstream is closed."""
        run = self.running.get(response_id)
        if run is None or run.relay is None or run.relay.task is None:
            return False
        run.relay.cancel_requested = True
        run.relay.task.cancel()
        return True


def _reshape(status: int, payload: bytes) -> tuple[int, bytes]:
    return rs.reshape_upstream_error(status, payload)
