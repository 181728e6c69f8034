"""The Starlette application: routes, the request's life, start-up and shut-down.

One request: authenticate → read and check the body → admission (wait for a dispatch decision)
→ proxy to the chosen backend (one retry elsewhere if nothing reached it) → release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from backends.pool import BackendPool
from gateway.auth import KeyStore
from gateway.config import Config
from gateway.dispatch import Dispatcher, Refused
from gateway.errors import GatewayError, error_body, error_response
from gateway.metrics import Metrics
from gateway.openai import Kind, ParsedRequest, parse, upstream_body
from gateway.proxy import RETRYABLE, Result, StreamWatch, read_body, read_usage, relay_stream, send_bytes
from policies import registry
from policies.prefix import request_fingerprint, total_tokens
from policies.tokens import TokenEstimator
from policies.types import Dispatch, Outcome, Refuse, RequestFacts

log = logging.getLogger("cachegate")

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


class Gateway:
    """Everything one worker holds: config, keys, pool, decision core, upstream client, metrics."""

    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        self.config = config
        self.keys = KeyStore(config)
        self.metrics = metrics or Metrics()
        self.core = registry.build(config.policy)
        configure = getattr(self.core, "configure", None)
        if configure is not None:
            configure({"teams": {n: t.model_dump() for n, t in config.teams.items()},
                       "admission": config.admission.model_dump(exclude_none=True)})
        self.dispatcher = Dispatcher(self.core)
        self.dispatcher.on_decision = self._count_decision
        self.estimator = TokenEstimator()
        self.client: httpx.AsyncClient | None = None
        self.pool: BackendPool | None = None
        self.started_at = int(time.time())
        self._alias_of: dict[str, str] = {}

    def _count_decision(self, decision: Dispatch | Refuse) -> None:
        if isinstance(decision, Dispatch):
            alias = self._alias_of.get(decision.rid, "")
            self.metrics.routes.labels(alias, decision.backend, decision.reason).inc()

    async def start(self) -> None:
        up = self.config.upstream
        timeout = httpx.Timeout(connect=up.connect_timeout_s, read=up.idle_timeout_s, write=up.idle_timeout_s,
                                pool=up.connect_timeout_s)
        limits = httpx.Limits(max_connections=up.max_connections, max_keepalive_connections=up.max_connections,
                              keepalive_expiry=up.keepalive_expiry_s)
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)
        self.pool = BackendPool(self.config, self.client)
        self.pool.subscribe(self._backends_changed)
        self.dispatcher.start()
        await self.pool.start()
        if self.keys.open:
            log.warning("no API keys configured: the gateway is open to anyone who can reach it")

    async def stop(self) -> None:
        if self.pool:
            await self.pool.stop()
        await self.dispatcher.stop()
        if self.client:
            await self.client.aclose()

    def _backends_changed(self, alias: str, views: list[Any]) -> None:
        self.dispatcher.set_backends(alias, views)
        if self.pool is None:
            return
        for backend in self.pool.models.get(alias, []):
            m = self.metrics
            m.backend_healthy.labels(backend.name).set(1 if backend.healthy else 0)
            m.backend_breaker.labels(backend.name).set(0 if backend.healthy else 2)
            m.backend_kv.labels(backend.name).set(backend.token_usage)
            m.backend_running.labels(backend.name).set(backend.running)
            m.backend_waiting.labels(backend.name).set(backend.waiting)
            m.backend_hit.labels(backend.name).set(backend.cache_hit_rate)


async def _read_body(receive: Receive, headers: Headers, limit: int) -> bytes | None:
    """The request body, or None if the client left; 413 past ``limit`` bytes."""
    declared = headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise GatewayError(413, f"Request body too large: {declared} bytes (limit {limit}).",
                           "request_too_large")
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


class CompletionsEndpoint:
    """``POST /v1/chat/completions`` and ``POST /v1/completions`` as a raw ASGI app, so that a client
    that leaves at any moment (waiting, or mid-stream) cancels the work and closes the upstream."""

    def __init__(self, gateway: Gateway, kind: Kind) -> None:
        self.gw = gateway
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gw = self.gw
        rid = f"cg-{uuid.uuid4().hex}"
        arrived = time.monotonic()
        headers = Headers(scope=scope)
        team = "unknown"
        try:
            team = gw.keys.team_for(headers)
            raw = await _read_body(receive, headers, gw.config.max_body_bytes)
            if raw is None:
                return
            parsed = parse(raw, self.kind)
            if parsed.model not in gw.config.models:
                raise GatewayError(404, f"The model '{parsed.model}' does not exist.", "model_not_found",
                                   "model")
        except GatewayError as err:
            gw.metrics.requests.labels(team, "", "", str(err.status)).inc()
            await error_response(err)(scope, receive, send)
            return
        work = asyncio.create_task(self._serve(rid, team, parsed, arrived, send))
        watcher = asyncio.create_task(_wait_disconnect(receive))
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if watcher in done:
            work.cancel()
        else:
            watcher.cancel()
        for task in (work, watcher):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _serve(self, rid: str, team: str, req: ParsedRequest, arrived: float, send: Send) -> None:
        gw = self.gw
        m = gw.metrics
        alias = req.model
        fingerprint, rendered = request_fingerprint(req.body, gw.estimator.ratio)
        req.prompt_bytes = rendered
        facts = RequestFacts(rid=rid, model=alias, team=team, stream=req.stream,
                             prompt_tokens=total_tokens(fingerprint), max_output_tokens=req.max_tokens or 0,
                             fingerprint=fingerprint)
        gw._alias_of[rid] = alias
        status = 0
        backend_name = ""
        m.queued.labels(team).inc()
        try:
            decision = await gw.dispatcher.admit(facts)
        except Refused as refused:
            r = refused.refusal
            m.refusals.labels(team, r.code).inc()
            m.requests.labels(team, alias, "", str(r.status)).inc()
            gw._alias_of.pop(rid, None)
            retry_after = str(max(1, round(r.retry_after_s)))
            await send_bytes(send, r.status, error_body(r.status, r.message, r.code), b"application/json",
                             [(b"retry-after", retry_after.encode()), (b"x-request-id", rid.encode())])
            return
        finally:
            m.queued.labels(team).dec()
            m.queue_wait.labels(team, alias).observe(time.monotonic() - arrived)
        m.inflight.labels(team).inc()
        result = Result()
        try:
            status, backend_name = await self._proxy(rid, req, decision, result, send)
        except GatewayError as err:
            status = err.status
            await send_bytes(send, err.status, error_body(err.status, err.message, err.code),
                             b"application/json", [(b"x-request-id", rid.encode())])
        finally:
            m.inflight.labels(team).dec()
            gw._alias_of.pop(rid, None)
            ok = status == 200 and result.stream_error is None
            gw.dispatcher.release(rid, Outcome(ok=ok, prompt_tokens=result.prompt_tokens,
                                               completion_tokens=result.completion_tokens,
                                               cached_tokens=result.cached_tokens,
                                               reached_backend=status != 0))
            self._observe(team, alias, backend_name, status, arrived, req, result)

    async def _proxy(self, rid: str, req: ParsedRequest, decision: Dispatch, result: Result,
                     send: Send) -> tuple[int, str]:
        gw = self.gw
        assert gw.client is not None and gw.pool is not None
        extra = [(b"x-request-id", rid.encode())]
        for attempt in range(2):
            backend = gw.pool.get(req.model, decision.backend)
            rank = decision.rank if backend.dp_size > 1 else None
            body, injected = upstream_body(req, backend.upstream_model, rank=rank)
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                       "x-request-id": rid, **backend.headers()}
            request = gw.client.build_request("POST", backend.url + PATHS[self.kind], content=body,
                                              headers=headers)
            try:
                response = await gw.client.send(request, stream=True)
            except RETRYABLE as exc:
                gw.metrics.upstream_errors.labels(backend.name, "connect").inc()
                gw.pool.mark_failure(backend, f"{type(exc).__name__}: {exc}", eject=True)
                if attempt == 0:
                    retry = gw.dispatcher.retry(rid, backend.name)
                    if isinstance(retry, Dispatch):
                        decision = retry
                        continue
                raise GatewayError(502, f"Could not reach a backend for model '{req.model}'.",
                                   "upstream_unreachable") from None
            except httpx.TimeoutException:
                gw.metrics.upstream_errors.labels(backend.name, "timeout").inc()
                raise GatewayError(504, "The backend did not answer in time.", "upstream_timeout") from None
            except httpx.HTTPError as exc:
                gw.metrics.upstream_errors.labels(backend.name, "connect").inc()
                raise GatewayError(502, f"Upstream error: {type(exc).__name__}.", "upstream_error") from None
            try:
                result.status = response.status_code
                if response.status_code >= 500:
                    gw.metrics.upstream_errors.labels(backend.name, "status_5xx").inc()
                if response.status_code != 200 or not req.stream:
                    try:
                        payload = await read_body(response)
                    except httpx.TimeoutException:
                        gw.metrics.upstream_errors.labels(backend.name, "timeout").inc()
                        raise GatewayError(504, "The backend did not answer in time.",
                                           "upstream_timeout") from None
                    except httpx.HTTPError:
                        gw.metrics.upstream_errors.labels(backend.name, "stream_broken").inc()
                        raise GatewayError(502, "The backend connection broke.", "upstream_error") from None
                    if response.status_code == 200:
                        read_usage(payload, result)
                        if result.completion_tokens:
                            result.first_token_at = time.monotonic()
                    ctype = response.headers.get("content-type", "application/json").encode()
                    await send_bytes(send, response.status_code, payload, ctype, extra)
                else:
                    watch = StreamWatch(result, injected, lambda: gw.dispatcher.first_token(rid))
                    await relay_stream(response, send, watch, gw.config.upstream.sse_keepalive_s, extra)
                    if result.stream_error in ("timeout", "stream_broken"):
                        gw.metrics.upstream_errors.labels(backend.name, result.stream_error).inc()
            finally:
                await response.aclose()
            return response.status_code, backend.name
        raise AssertionError("unreachable")

    def _observe(self, team: str, alias: str, backend: str, status: int, arrived: float,
                 req: ParsedRequest, result: Result) -> None:
        m = self.gw.metrics
        now = time.monotonic()
        m.requests.labels(team, alias, backend, str(status or 499)).inc()
        if status != 200:
            return
        m.duration.labels(team, alias, backend).observe(now - arrived)
        if result.first_token_at is not None:
            m.ttft.labels(team, alias, backend).observe(result.first_token_at - arrived)
            if result.last_token_at and result.completion_tokens > 1:
                m.itl.labels(team, alias, backend).observe(
                    (result.last_token_at - result.first_token_at) / (result.completion_tokens - 1))
        if result.usage:
            m.tokens.labels(team, alias, "input").inc(result.prompt_tokens)
            m.tokens.labels(team, alias, "cached").inc(result.cached_tokens)
            m.tokens.labels(team, alias, "output").inc(result.completion_tokens)
            self.gw.estimator.observe(req.prompt_bytes, result.prompt_tokens)


def create_app(config: Config, metrics: Metrics | None = None) -> Starlette:
    gw = Gateway(config, metrics)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(a, gw.started_at) for a in config.models]})

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in config.models:
            raise GatewayError(404, f"The model '{name}' does not exist.", "model_not_found", "model")
        return JSONResponse(_model_card(name, gw.started_at))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        backends = {b.name: {"healthy": b.healthy, "model": b.model, "error": b.last_error or None}
                    for b in (gw.pool.all() if gw.pool else [])}
        ready = gw.pool is not None and gw.pool.any_healthy()
        return JSONResponse({"status": "ready" if ready else "not ready", "backends": backends},
                            status_code=200 if ready else 503)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            err = GatewayError(404, f"Unknown request URL: {request.method} {request.url.path}", "unknown_url")
        elif exc.status_code == 405:
            err = GatewayError(405, f"Method {request.method} is not allowed on {request.url.path}.",
                               "method_not_allowed")
        else:
            err = GatewayError(exc.status_code, str(exc.detail), None)
        return error_response(err)

    async def on_crash(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(GatewayError(500, "Internal server error.", "internal_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    routes = [
        Route("/v1/chat/completions", CompletionsEndpoint(gw, "chat"), methods=["POST"]),
        Route("/v1/completions", CompletionsEndpoint(gw, "completion"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={GatewayError: on_gateway_error, HTTPException: on_http_error,
                                        Exception: on_crash})
    app.state.gateway = gw
    return app


def _model_card(alias: str, created: int) -> dict[str, Any]:
    return {"id": alias, "object": "model", "created": created, "owned_by": "cachegate"}


def app_from_env() -> Starlette:
    """Factory for ``--workers N``: each worker process rebuilds the app from the serialised config."""
    return create_app(Config.model_validate_json(os.environ["CACHEGATE_CONFIG_JSON"]))
