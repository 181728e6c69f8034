"""One request's life, the same for every client surface:

    authenticate → read the body (413 past the cap) → parse (the surface's parser) → model check
    → facts (fingerprint, token estimate) → admit (wait for the decision core's dispatch or refusal)
    → route → upstream attempts (``gateway/request/upstream.py``; one retry elsewhere if nothing reached)
    → relay (the surface's relay) → release (the core learns the outcome) → metrics, trace, access log

``RequestPath`` is that path for one ``Surface`` (``gateway/surfaces/base.py``), as a raw ASGI app,
watched the whole time for its client leaving (under ``cachegate serve`` the connection reports it,
``LimitedHttpToolsProtocol.watch_lost``; elsewhere a watcher task waits for ``http.disconnect``), so
a client that leaves at any moment (waiting, or mid-stream) cancels the work, which closes the
upstream connection and runs every ``finally`` that gives back what the request held. Every error is
answered in the surface's envelope (``Surface.error``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from gateway.http.errors import GatewayError
from gateway.http.server import DIRECT, LimitedHttpToolsProtocol
from gateway.observability.access import AccessRecord, access_record
from gateway.observability.telemetry import bind, current_trace
from gateway.relay.proxy import Result, WholeSend, send_bytes
from gateway.request.dispatch import Refused
from gateway.request.held import HeldOpen
from gateway.request.upstream import Exchange
from gateway.surfaces.base import ClientRequest, Surface
from policies.prefix import request_fingerprint, total_tokens
from policies.types import Dispatch, Outcome, RequestFacts

if TYPE_CHECKING:  # the worker sits above the request path: its type only
    from gateway.worker import Gateway

log = logging.getLogger("cachegate")

_RANDOM = b""
_RANDOM_AT = 0


def _forget_random() -> None:
    global _RANDOM
    _RANDOM = b""  # a forked child draws its own bytes: no two processes share request ids


os.register_at_fork(after_in_child=_forget_random)


def request_id() -> str:
    """``cg-`` and 16 bytes from ``os.urandom`` (as random as uuid4), drawn 4 KiB at a time: one
    getrandom call per 256 requests instead of one each."""
    global _RANDOM, _RANDOM_AT
    at = _RANDOM_AT
    if at + 16 > len(_RANDOM):
        _RANDOM, at = os.urandom(4096), 0
    _RANDOM_AT = at + 16
    return "cg-" + _RANDOM[at : at + 16].hex()


async def read_body(receive: Receive, headers: Headers, limit: int) -> bytes | None:
    """The request body, or None if the client left; 413 past ``limit`` bytes."""
    declared = headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"Request body too large: {declared} bytes (limit {limit}).", "request_too_large")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, f"Request body too large (limit {limit} bytes).", "request_too_large")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


class _Tracked(WholeSend):
    """The request's ``send``: notes the status the client got (for the access log) and when the
    response is complete (the client leaving after that is not a client leaving). On our server it
    is also a ``WholeSend``: a whole response goes out in one write (``LimitedHttpToolsProtocol.respond``)."""

    __slots__ = ("_client", "_record", "_scope", "_send", "complete")

    def __init__(self, send: Send, record: AccessRecord, client: LimitedHttpToolsProtocol | None, scope: Scope) -> None:
        self._send = send
        self._record = record
        self._client = client
        self._scope = scope
        self.complete = False

    async def __call__(self, message: Message) -> None:
        await self._send(message)
        if message["type"] == "http.response.body":
            if not message.get("more_body", False):
                self.complete = True
        elif message["type"] == "http.response.start" and not self._record.status:
            self._record.status = int(message["status"])

    def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        if self._client is None or not self._client.respond(self._scope, status, headers, body):
            return False
        self.complete = True
        if not self._record.status:
            self._record.status = status
        return True


class RequestPath:
    """``POST surface.path`` as a raw ASGI app (see the module docstring)."""

    def __init__(self, gateway: Gateway, surface: Surface) -> None:
        self.gw = gateway
        self.surface = surface
        self._prepares = type(surface).prepare is not Surface.prepare
        """Whether the surface has work before admission (a coroutine less per request if not)."""

    def overloaded(self, message: str, retry_after_s: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """A 503 ``overloaded`` in the surface's envelope (the overload guard sheds with it)."""
        reply = self.surface.error(
            GatewayError(503, message, "overloaded", headers={"retry-after": str(retry_after_s)})
        )
        headers = [(b"content-type", reply.content_type), (b"content-length", str(len(reply.body)).encode())]
        if not any(k == b"x-cachegate-code" for k, _ in reply.headers):
            headers.append((b"x-cachegate-code", b"overloaded"))
        return [*headers, *reply.headers], reply.body

    async def _reply_error(self, send: Send, err: GatewayError, rid: str) -> None:
        reply = self.surface.error(err)
        await send_bytes(
            send, reply.status, reply.body, reply.content_type, [*reply.headers, (b"x-request-id", rid.encode())]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._handle(scope, receive, send)
        except Exception:
            # A bug, not a request's fault: a 500 in the surface's envelope (Starlette's error middleware
            # would answer in OpenAI's) if nothing was sent yet; else the server drops the connection.
            record = access_record(scope)
            if record.status:
                raise
            record.status = 500
            log.exception("unhandled error on POST %s", scope.get("path"))
            reply = self.surface.error(GatewayError(500, "Internal server error.", "internal_error"))
            await send_bytes(send, reply.status, reply.body, reply.content_type, reply.headers)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        rid = request_id()
        arrived = time.monotonic()
        headers = Headers(scope=scope)
        trace = gw.telemetry.begin(self.surface.name, headers)
        record = access_record(scope)
        team = "unknown"
        try:
            team = record.team = gw.keys.team_for(headers)
            raw = await read_body(receive, headers, gw.config.max_body_bytes)
            if raw is None:
                trace.end(client_left=True)
                return
            req = self.surface.parse(raw)
            trace.request(rid, team, req)
            alias = gw.config.resolve_model(req.model)
            if alias is None:
                raise GatewayError(404, f"The model '{req.model}' does not exist.", "model_not_found", "model")
            req.model, req.team, req.headers = alias, team, headers
            lent = scope.get("extensions", {}).get(DIRECT)
            if isinstance(lent, LimitedHttpToolsProtocol):  # our server: the relay writes chunks itself
                req.client = lent
            else:
                lent = None
            if self._prepares:
                await self.surface.prepare(req)
        except GatewayError as err:
            gw.metrics.requests.labels(team, "", "", str(err.status)).inc()
            trace.failed(err.status, err.code)
            trace.end()
            record.status = err.status  # AccessLog does not watch this route's sends (see access.py)
            await self._reply_error(send, err, rid)
            return
        bind(trace)  # the tasks below inherit it (current_trace())
        tracked = _Tracked(send, record, lent, scope)

        # The work runs in this task; it is cancelled if the client leaves. On our server the
        # connection says so when it closes (no task per request); elsewhere one watcher task waits
        # for ``http.disconnect``. uvicorn's receive() also says "disconnect" once the response is
        # complete: not a client leaving.
        # our connection knows its loop: asyncio.current_task() would look it up (a getpid syscall)
        task = asyncio.current_task(lent.loop if lent is not None else None)
        assert task is not None
        client_left = False

        def left() -> None:
            nonlocal client_left
            if not tracked.complete:
                client_left = True
                task.cancel()

        watcher = None
        if lent is None:

            async def watch() -> None:
                await _wait_disconnect(receive)
                left()

            watcher = asyncio.create_task(watch())
        elif not lent.watch_lost(left):
            left()
        try:
            await self._serve(rid, team, req, arrived, tracked, record)
        except asyncio.CancelledError:
            if not client_left:
                raise
        finally:
            if watcher is not None:
                watcher.cancel()
            elif lent is not None:
                lent.unwatch_lost(left)
            if client_left and task.cancelling():
                task.uncancel()
            trace.end(client_left=client_left)

    async def _serve(
        self, rid: str, team: str, req: ClientRequest, arrived: float, send: Send, record: AccessRecord
    ) -> None:
        gw = self.gw
        m = gw.metrics
        alias = req.model
        fingerprint, rendered = request_fingerprint(req.prompt, gw.estimator.ratio)
        req.prompt_bytes = rendered
        req.fingerprint = fingerprint
        facts = RequestFacts(
            rid=rid,
            model=alias,
            team=team,
            stream=req.stream,
            prompt_tokens=total_tokens(fingerprint),
            max_output_tokens=req.max_tokens or 0,
            fingerprint=fingerprint,
        )
        if gw.kv is not None:  # a conversation new to this replica: learn its engine blocks first (bounded)
            await gw.kv.learner.before_route(req.prompt, fingerprint, rendered)
        trace = current_trace()
        trace.facts(facts.prompt_tokens)
        trace.admission_started()
        # Only a stream can be held open while it waits; for anything else HeldOpen passes through.
        after_s = gw.config.queue_open_after_s if req.stream else 0.0
        held = HeldOpen(send, self.surface, rid, after_s, gw.config.upstream.sse_keepalive_s) if after_s > 0 else None
        if held is not None:
            held.start()
            send = held.send
        try:
            first = gw.dispatcher.admit_now(facts)
            decision = (
                first if isinstance(first, Dispatch) else await gw.dispatcher.wait(facts, first, m.queued.labels(team))
            )
        except Refused as refused:
            r = refused.refusal
            m.refusals.labels(team, r.code).inc()
            m.requests.labels(team, alias, "", str(r.status)).inc()
            trace.failed(r.status, r.code)
            record.refusal = r.code
            # a 400 (a request that can never run) is not to be retried: no Retry-After
            retry = {"retry-after": str(max(1, round(r.retry_after_s)))} if r.status in (429, 503) else {}
            await self._reply_error(send, GatewayError(r.status, r.message, r.code, headers=retry), rid)
            return
        finally:
            if held is not None:
                await held.stop()
                if not held.opened:
                    send = held.inner  # nothing to rewrite: one wrapper less per relayed chunk
            waited = time.monotonic() - arrived
            record.queue_wait_s = waited
            m.queue_wait.labels(team, alias).observe(waited, trace.exemplar())
            trace.admission_done(waited)
        gw.routed(alias, decision, trace)
        inflight = m.inflight.labels(team)
        inflight.inc()
        exchange = Exchange()
        client_left = False
        try:
            await gw.upstream.forward(
                rid, req, self.surface, decision, send, trace, lambda retry: gw.routed(alias, retry, trace), exchange
            )
            if exchange.error is not None:
                err = exchange.error
                trace.failed(err.status, err.code)
                if err.code == "overloaded":  # the worker's own upstream connection budget: a refusal
                    m.refusals.labels(team, err.code).inc()
                    record.refusal = err.code
                await self._reply_error(send, err, rid)
        except asyncio.CancelledError:
            client_left = True
            raise
        finally:
            inflight.dec()
            result = exchange.result
            gw.dispatcher.release(
                rid,
                Outcome(
                    ok=exchange.ok and not client_left,
                    prompt_tokens=result.prompt_tokens,
                    completion_tokens=result.completion_tokens,
                    cached_tokens=result.cached_tokens,
                    reached_backend=exchange.reached_backend,
                    refused=exchange.refused,
                ),
            )
            record.backend = exchange.backend
            if gw.kv is not None and exchange.ok and not client_left:
                gw.kv.learner.observe(exchange.backend, req.prompt, fingerprint, rendered)
            if result.first_token_at is not None:
                record.ttft_s = result.first_token_at - arrived
            status = exchange.error.status if exchange.error else exchange.status
            self._observe(team, alias, exchange.backend, 0 if client_left else status, arrived, req, result)

    def _observe(
        self, team: str, alias: str, backend: str, status: int, arrived: float, req: ClientRequest, result: Result
    ) -> None:
        m = self.gw.metrics
        now = time.monotonic()
        trace = current_trace()
        if status:
            trace.finished(status, result)
        m.requests.labels(team, alias, backend, str(status or 499)).inc()
        if status != 200:
            return
        exemplar = trace.exemplar()  # only for a sampled trace: an exemplar must lead somewhere
        m.duration.labels(team, alias, backend).observe(now - arrived, exemplar)
        if result.first_token_at is not None:
            m.ttft.labels(team, alias, backend).observe(result.first_token_at - arrived, exemplar)
            if result.last_token_at and result.completion_tokens > 1:
                m.itl.labels(team, alias, backend).observe(
                    (result.last_token_at - result.first_token_at) / (result.completion_tokens - 1), exemplar
                )
        if result.usage:
            m.tokens.labels(team, alias, "input").inc(result.prompt_tokens)
            m.tokens.labels(team, alias, "cached").inc(result.cached_tokens)
            m.tokens.labels(team, alias, "output").inc(result.completion_tokens)
            self.gw.estimator.observe(req.prompt_bytes, result.prompt_tokens)
