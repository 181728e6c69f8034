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
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from backends.pool import BackendPool
from gateway import admin, exposure
from gateway.admin import describe_limits
from gateway.auth import KeyStore
from gateway.config import Config, TeamConfig
from gateway.dispatch import Dispatcher, Refused
from gateway.errors import GatewayError, error_body, error_response
from gateway.metrics import Metrics
from gateway.openai import Kind, ParsedRequest, parse, upstream_body
from gateway.proxy import RETRYABLE, Result, StreamWatch, read_body, read_usage, relay_stream, send_bytes
from gateway.state import MemoryState, RedisState
from gateway.telemetry import RequestTrace, Telemetry, bind, current_trace
from policies import registry
from policies.prefix import request_fingerprint, total_tokens
from policies.teams import TeamLimits
from policies.tokens import TokenEstimator
from policies.types import Dispatch, Outcome, RequestFacts

log = logging.getLogger("cachegate")

PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


class Gateway:
    """Everything one worker holds: config, keys, pool, decision core, upstream client, metrics."""

    def __init__(self, config: Config, metrics: Metrics | None = None, admin_token: str | None = None) -> None:
        self.config = config
        self.keys = KeyStore(config)
        self.metrics = metrics or Metrics()
        self.telemetry = Telemetry(config.telemetry)
        self.core = registry.build(config.policy)
        configure = getattr(self.core, "configure", None)
        if configure is not None:
            configure({"teams": {n: t.model_dump() for n, t in config.teams.items()},
                       "admission": config.admission.model_dump(exclude_none=True)})
        self.state: MemoryState | RedisState = (RedisState(config.redis_url, lease_ttl_s=config.lease_ttl_s)
                                                if config.redis_url else MemoryState())
        self.state.on_wake = lambda team: self.dispatcher.wake(team)
        self.state.on_limits = self._limits_changed
        self.state.on_share = self._share_changed
        self.admin_token = admin_token or os.environ.get(config.admin_token_env) or None
        self.dispatcher = Dispatcher(self.core, state=self.state)
        self.estimator = TokenEstimator()
        self.client: httpx.AsyncClient | None = None
        self.pool: BackendPool | None = None
        self.started_at = int(time.time())

    # ----- team limits and shared state ---------------------------------------------------------

    def team_limits(self, name: str) -> dict[str, Any]:
        """The limits in force for team ``name`` (runtime changes over the config's, or the default's)."""
        state = getattr(self.core, "teams", {}).get(name)
        limits = getattr(self.core, "limits", {}).get(name)
        if limits is None and state is not None:
            limits = state.limits
        if limits is None:
            cfg = self.config.teams.get(name) or self.config.teams["default"]
            return cfg.model_dump()
        return describe_limits(limits)

    def team_view(self, name: str) -> dict[str, Any]:
        state = getattr(self.core, "teams", {}).get(name)
        return {"team": name, "limits": self.team_limits(name),
                "inflight": state.inflight if state else 0, "waiting": state.waiting if state else 0}

    def state_view(self) -> dict[str, Any]:
        snapshot = getattr(self.core, "snapshot", None)
        backends = {b.name: {"model": b.model, "healthy": b.healthy, "running": b.running, "waiting": b.waiting,
                             "token_usage": b.token_usage, "max_total_num_tokens": b.max_total_num_tokens}
                    for b in (self.pool.all() if self.pool else [])}
        return {"policy": self.config.policy, "state": self.state.status(), "core": snapshot() if snapshot else {},
                "backends": backends, "waiting": self.dispatcher.waiting}

    def _limits_changed(self, team: str, fields: dict[str, Any]) -> None:
        set_team = getattr(self.core, "set_team", None)
        if set_team is not None:
            known = {k: v for k, v in fields.items() if k in TeamConfig.model_fields}
            set_team(team, TeamLimits(**TeamConfig.model_validate(known).model_dump()))
            self.dispatcher.wake(team)

    def _share_changed(self, share: float, split: bool) -> None:
        self.metrics.redis_degraded.set(1 if split and self.config.redis_url else 0)
        self.dispatcher.set_share(share, split)

    def routed(self, alias: str, decision: Dispatch, trace: RequestTrace) -> None:
        """A dispatch the request will use (first or retry): counted here, once, not per core decision,
        since a decision the lease then sends back to the queue is not a dispatch."""
        self.metrics.routes.labels(alias, decision.backend, decision.reason).inc()
        trace.routed(decision)

    async def start(self) -> None:
        up = self.config.upstream
        timeout = httpx.Timeout(connect=up.connect_timeout_s, read=up.idle_timeout_s, write=up.idle_timeout_s,
                                pool=up.connect_timeout_s)
        limits = httpx.Limits(max_connections=up.max_connections, max_keepalive_connections=up.max_connections,
                              keepalive_expiry=up.keepalive_expiry_s)
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)
        self.pool = BackendPool(self.config, self.client)
        self.pool.subscribe(self._backends_changed)
        self.metrics.init_labels(self.config.teams, (b.name for b in self.pool.all()))
        self.dispatcher.start()
        await self.state.start()
        await self.pool.start()
        if self.keys.open:
            log.warning("no API keys configured: the gateway is open to anyone who can reach it")

    async def stop(self) -> None:
        if self.pool:
            await self.pool.stop()
        await self.dispatcher.stop()
        await self.state.stop()
        if self.client:
            await self.client.aclose()
        self.telemetry.shutdown()
        self.metrics.close()

    def _backends_changed(self, alias: str, views: list[Any]) -> None:
        self.dispatcher.set_backends(alias, views)
        if self.pool is None:
            return
        for backend in self.pool.models.get(alias, []):
            m = self.metrics
            m.backend_healthy.labels(backend.name).set(1 if backend.healthy else 0)
            m.backend_breaker.labels(backend.name).set(backend.breaker_state)
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
        trace = gw.telemetry.begin(self.kind, headers)
        team = "unknown"
        try:
            team = gw.keys.team_for(headers)
            raw = await _read_body(receive, headers, gw.config.max_body_bytes)
            if raw is None:
                trace.end(client_left=True)
                return
            parsed = parse(raw, self.kind)
            trace.request(rid, team, parsed)
            if parsed.model not in gw.config.models:
                raise GatewayError(404, f"The model '{parsed.model}' does not exist.", "model_not_found",
                                   "model")
        except GatewayError as err:
            gw.metrics.requests.labels(team, "", "", str(err.status)).inc()
            trace.failed(err.status, err.code)
            trace.end()
            await error_response(err)(scope, receive, send)
            return
        bind(trace)  # the tasks below inherit it (current_trace())
        complete = False

        async def send_tracked(message: Message) -> None:
            nonlocal complete
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True

        work = asyncio.create_task(self._serve(rid, team, parsed, arrived, send_tracked))
        watcher = asyncio.create_task(_wait_disconnect(receive))
        client_left = False
        try:
            done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            # uvicorn's receive() also says "disconnect" once the response is complete: not a client leaving.
            client_left = watcher in done and not complete
            if client_left:
                work.cancel()
            else:
                watcher.cancel()
            for task in (work, watcher):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            trace.end(client_left=client_left)

    async def _serve(self, rid: str, team: str, req: ParsedRequest, arrived: float, send: Send) -> None:
        gw = self.gw
        m = gw.metrics
        alias = req.model
        fingerprint, rendered = request_fingerprint(req.body, gw.estimator.ratio)
        req.prompt_bytes = rendered
        facts = RequestFacts(rid=rid, model=alias, team=team, stream=req.stream,
                             prompt_tokens=total_tokens(fingerprint), max_output_tokens=req.max_tokens or 0,
                             fingerprint=fingerprint)
        trace = current_trace()
        trace.facts(facts.prompt_tokens)
        status = 0
        backend_name = ""
        m.queued.labels(team).inc()
        trace.admission_started()
        try:
            decision = await gw.dispatcher.admit(facts)
        except Refused as refused:
            r = refused.refusal
            m.refusals.labels(team, r.code).inc()
            m.requests.labels(team, alias, "", str(r.status)).inc()
            trace.failed(r.status, r.code)
            retry_after = str(max(1, round(r.retry_after_s)))
            await send_bytes(send, r.status, error_body(r.status, r.message, r.code), b"application/json",
                             [(b"retry-after", retry_after.encode()), (b"x-request-id", rid.encode())])
            return
        finally:
            m.queued.labels(team).dec()
            waited = time.monotonic() - arrived
            m.queue_wait.labels(team, alias).observe(waited, trace.exemplar())
            trace.admission_done(waited)
        gw.routed(alias, decision, trace)
        m.inflight.labels(team).inc()
        result = Result()
        try:
            status, backend_name = await self._proxy(rid, req, decision, result, send)
        except GatewayError as err:
            status = err.status
            trace.failed(err.status, err.code)
            await send_bytes(send, err.status, error_body(err.status, err.message, err.code),
                             b"application/json", [(b"x-request-id", rid.encode())])
        finally:
            m.inflight.labels(team).dec()
            ok = status == 200 and result.stream_error is None
            gw.dispatcher.release(rid, Outcome(ok=ok, prompt_tokens=result.prompt_tokens,
                                               completion_tokens=result.completion_tokens,
                                               cached_tokens=result.cached_tokens,
                                               reached_backend=status != 0, refused=400 <= status < 500))
            self._observe(team, alias, backend_name, status, arrived, req, result)

    async def _proxy(self, rid: str, req: ParsedRequest, decision: Dispatch, result: Result,
                     send: Send) -> tuple[int, str]:
        gw = self.gw
        assert gw.client is not None and gw.pool is not None
        extra = [(b"x-request-id", rid.encode())]
        trace = current_trace()
        for attempt in range(2):
            backend = gw.pool.get(req.model, decision.backend)
            rank = decision.rank if backend.dp_size > 1 else None
            body, injected = upstream_body(req, backend.upstream_model, rank=rank)
            headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
                       "x-request-id": rid, **backend.headers()}
            upstream = trace.upstream(backend.name, backend.url + PATHS[self.kind], headers)  # + traceparent
            request = gw.client.build_request("POST", backend.url + PATHS[self.kind], content=body,
                                              headers=headers)
            try:
                response = await gw.client.send(request, stream=True)
            except RETRYABLE as exc:
                upstream.failed("connect", exc)
                gw.metrics.upstream_errors.labels(backend.name, "connect").inc()
                gw.pool.request_failed(backend, "connect", f"{type(exc).__name__}: {exc}")
                if attempt == 0:
                    retry = gw.dispatcher.retry(rid, backend.name)
                    if isinstance(retry, Dispatch):
                        decision = retry
                        gw.routed(req.model, decision, trace)
                        continue
                raise GatewayError(502, f"Could not reach a backend for model '{req.model}'.",
                                   "upstream_unreachable") from None
            except httpx.TimeoutException as exc:
                upstream.failed("timeout", exc)
                gw.metrics.upstream_errors.labels(backend.name, "timeout").inc()
                gw.pool.request_failed(backend, "timeout", "no answer in time")
                raise GatewayError(504, "The backend did not answer in time.", "upstream_timeout") from None
            except httpx.HTTPError as exc:
                upstream.failed("connect", exc)
                gw.metrics.upstream_errors.labels(backend.name, "connect").inc()
                gw.pool.request_failed(backend, "connect", f"{type(exc).__name__}: {exc}")
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
                        result.stream_error = "timeout"
                        raise GatewayError(504, "The backend did not answer in time.",
                                           "upstream_timeout") from None
                    except httpx.HTTPError:
                        gw.metrics.upstream_errors.labels(backend.name, "stream_broken").inc()
                        result.stream_error = "stream_broken"
                        raise GatewayError(502, "The backend connection broke.", "upstream_error") from None
                    if response.status_code == 200:
                        read_usage(payload, result)
                        if result.completion_tokens:
                            result.first_token_at = time.monotonic()
                            trace.first_token()
                    ctype = response.headers.get("content-type", "application/json").encode()
                    await send_bytes(send, response.status_code, payload, ctype, extra)
                else:
                    def first_token() -> None:
                        gw.dispatcher.first_token(rid)
                        trace.first_token()

                    watch = StreamWatch(result, injected, first_token)
                    await relay_stream(response, send, watch, gw.config.upstream.sse_keepalive_s, extra)
                    if result.stream_error in ("timeout", "stream_broken"):
                        gw.metrics.upstream_errors.labels(backend.name, result.stream_error).inc()
            finally:
                await response.aclose()
                upstream.done(response.status_code, result.stream_error)
                if response.status_code >= 500:
                    gw.pool.request_failed(backend, "status_5xx", f"answered {response.status_code}")
                elif result.stream_error in ("timeout", "stream_broken"):
                    gw.pool.request_failed(backend, result.stream_error, "the response broke off")
                else:
                    gw.pool.request_ok(backend)
            return response.status_code, backend.name
        raise AssertionError("unreachable")

    def _observe(self, team: str, alias: str, backend: str, status: int, arrived: float,
                 req: ParsedRequest, result: Result) -> None:
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
                    (result.last_token_at - result.first_token_at) / (result.completion_tokens - 1), exemplar)
        if result.usage:
            m.tokens.labels(team, alias, "input").inc(result.prompt_tokens)
            m.tokens.labels(team, alias, "cached").inc(result.cached_tokens)
            m.tokens.labels(team, alias, "output").inc(result.completion_tokens)
            self.gw.estimator.observe(req.prompt_bytes, result.prompt_tokens)


def create_app(config: Config, metrics: Metrics | None = None, admin_token: str | None = None) -> Starlette:
    gw = Gateway(config, metrics, admin_token)

    async def models(request: Request) -> Response:
        exposure.guard(gw, request)
        return JSONResponse({"object": "list", "data": [_model_card(a, gw.started_at) for a in config.models]})

    async def model(request: Request) -> Response:
        exposure.guard(gw, request)
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
        if not exposure.may_see(gw, request):
            return JSONResponse({"status": "ready" if ready else "not ready"}, status_code=200 if ready else 503)
        return JSONResponse({"status": "ready" if ready else "not ready", "backends": backends,
                             "state": gw.state.status()}, status_code=200 if ready else 503)

    async def metrics_endpoint(request: Request) -> Response:
        exposure.guard(gw, request, metrics=True)
        body, content_type = gw.metrics.exposition(request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

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
        metrics_server = exposure.MetricsServer(gw)
        await metrics_server.start()
        try:
            yield
        finally:
            await metrics_server.stop()
            await gw.stop()

    routes = [
        Route("/v1/chat/completions", CompletionsEndpoint(gw, "chat"), methods=["POST"]),
        Route("/v1/completions", CompletionsEndpoint(gw, "completion"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *admin.routes(gw),
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
