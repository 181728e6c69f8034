"""The live twin: one simulated SGLang 0.5.23 server (an :class:`Engine` behind SGLang's HTTP API).

Modules: ``runtime`` (the :class:`Twin`: engine, wall clock, requests in flight, disconnects),
``planner`` (what a request will produce), ``httpio`` (shared HTTP plumbing), ``routes_openai``
(chat, completions, models), ``routes_native`` (health, info, loads, metrics, generate, abort, ``/``,
``/openapi.json``), ``routes_responses`` + ``responses_api`` (``/v1/responses``), ``routes_messages`` +
``anthropic`` (``/v1/messages``), ``streaming`` (output pieces), ``responses`` (SGLang's chat JSON
bodies). This module wires them into one Starlette app; ``routes`` chooses which client surfaces
it serves (:data:`ROUTE_SETS`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.sim import routes_messages as messages_routes
from backends.sim import routes_native as native
from backends.sim import routes_openai as openai_routes
from backends.sim import routes_responses as responses_routes
from backends.sim import routes_tokenize
from backends.sim import routes_vllm as vllm_routes
from backends.sim.disagg import disagg_middleware
from backends.sim.metrics_vllm import VllmMetrics
from backends.sim.responses_api import Store
from backends.sim.runtime import DEFAULT_MODEL, SGLANG_VERSION, ApiError, Twin, tp_size

__all__ = ["DEFAULT_MODEL", "ROUTE_SETS", "SGLANG_VERSION", "ApiError", "Twin", "create_app", "tp_size"]

ROUTE_SETS: dict[str, frozenset[str]] = {
    "all": frozenset({"responses", "messages"}),
    "responses": frozenset({"responses"}),
    "chat": frozenset(),
}
"""Which client surfaces beyond chat and completions a twin serves: ``all`` (SGLang 0.5.23),
``responses`` (a build from before ``/v1/messages``), ``chat`` (an older build or another engine:
chat, completions and the native routes only)."""

HEADERS_SEEN = (
    "user-agent",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "x-stainless-lang",
    "originator",
    "x-data-parallel-rank",
)
"""Client headers :class:`RecordRequests` keeps (values); of ``authorization`` and ``x-api-key`` only
whether they were sent."""


class RecordRequests:
    """ASGI middleware: one entry per request in :attr:`Twin.requests` (method, path, query, the
    client headers of :data:`HEADERS_SEEN`, status)."""

    def __init__(self, app: ASGIApp, twin: Twin) -> None:
        self.app, self.twin = app, twin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_twin/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode(errors="replace") for k, v in scope["headers"]}
        entry: dict[str, Any] = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(errors="replace"),
            "headers": {k: headers[k] for k in HEADERS_SEEN if k in headers},
            "auth": sorted(k for k in ("authorization", "x-api-key") if k in headers),
            "status": None,
        }
        self.twin.requests.append(entry)

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
            await send(message)

        await self.app(scope, receive, send_and_note)


def create_app(
    profile: Any = "tiny",
    *,
    time_scale: float = 1.0,
    model: str = DEFAULT_MODEL,
    kv_tokens: int | None = None,
    unbounded: bool = False,
    cache_report: bool = True,
    abort_delay_s: float = 2.0,
    stream_interval_s: float = 0.03,
    reasoning: bool = False,
    startup_delay_s: float = 0.0,
    answer_scale: float = 1.0,
    routes: str = "all",
    engine_factory: Callable[..., Any] | None = None,
    engine: str = "sglang",
    disaggregation_mode: str = "null",
    disaggregation_bootstrap_port: int = 8998,
    host: str = "127.0.0.1",
    kv_events_config: str | None = None,
) -> Starlette:
    """A Starlette app serving one simulated SGLang 0.5.23 server.

    ``profile``: a profile name or object. ``cache_report=False`` mimics a server started without
    ``--enable-cache-report`` (``prompt_tokens_details`` null). ``reasoning=True`` (or a request with
    ``chat_template_kwargs: {"thinking": true}``) streams about a third of the answer as
    ``reasoning_content`` first. Tool calls: :mod:`backends.sim.agent`. Output length and context:
    :mod:`backends.sim.planner` (``answer_scale`` multiplies the 200-1,500-token answers).
    ``startup_delay_s``: /health answers 503 that long. ``routes``: a key of :data:`ROUTE_SETS`.
    ``engine``: ``sglang`` (SGLang 0.5.23's routes and metrics) or ``vllm`` (vLLM 0.33.0's:
    :mod:`backends.sim.routes_vllm`); the engine model behind them is the same.
    ``disaggregation_mode`` ``prefill`` or ``decode``: SGLang's PD roles (:mod:`backends.sim.disagg`;
    a prefill twin's bootstrap server listens on ``host``:``disaggregation_bootstrap_port``).
    ``kv_events_config``: SGLang's ``--kv-events-config`` JSON; with ``"publisher": "zmq"`` the twin
    publishes its radix cache's events as SGLang does (:mod:`backends.sim.kv_publisher`, needs pyzmq).
    """
    if routes not in ROUTE_SETS:
        raise ValueError(f"unknown route set {routes!r}; choose one of: {', '.join(ROUTE_SETS)}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    from backends.sim import engine as engine_mod
    from backends.sim import profiles as profiles_mod

    prof = profiles_mod.get_profile(profile) if isinstance(profile, str) else profile
    factory = engine_factory or engine_mod.Engine
    twin = Twin(
        factory(prof, kv_tokens=kv_tokens, unbounded=unbounded),
        profile=prof,
        model=model,
        time_scale=time_scale,
        cache_report=cache_report,
        abort_delay_s=abort_delay_s,
        stream_interval_s=stream_interval_s,
        reasoning=reasoning,
        startup_delay_s=startup_delay_s,
        answer_scale=answer_scale,
    )
    twin.dialect = engine
    if engine == "vllm":
        twin.metrics = VllmMetrics(model, twin._snapshot)
    if kv_events_config:
        from backends.kv_wire import KVEventsConfig

        cfg = KVEventsConfig.from_cli(kv_events_config)
        if cfg.publisher == "zmq":
            from backends.sim.kv_publisher import TwinEvents

            twin.events = TwinEvents(cfg, int(getattr(prof, "page_size", 1)) or 1, twin.engine._ranks)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await twin.start()
        try:
            yield
        finally:
            await twin.stop()

    table = _vllm_table() if engine == "vllm" else _sglang_table()
    table += [
        Route("/v1/chat/completions", openai_routes.chat, methods=["POST"]),
        Route("/v1/completions", openai_routes.completions, methods=["POST"]),
        Route("/_twin/last_traceparent", native.last_traceparent, methods=["GET"]),
        Route("/_twin/requests", native.seen_requests, methods=["GET"]),
    ]
    if engine == "sglang":  # vLLM serves no "/"
        table.append(Route("/", native.root, methods=["GET", "HEAD"]))
    table.append(Route("/openapi.json", native.openapi, methods=["GET"]))
    if "responses" in ROUTE_SETS[routes]:
        table += [
            Route("/v1/responses", responses_routes.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", responses_routes.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", responses_routes.cancel, methods=["POST"]),
        ]
    if "messages" in ROUTE_SETS[routes]:
        table += [
            Route("/v1/messages", messages_routes.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", messages_routes.count_tokens_route, methods=["POST"]),
        ]
    middleware = [Middleware(RecordRequests, twin=twin)]
    if engine == "vllm":
        middleware.append(Middleware(vllm_routes.VllmDialect))
    if disaggregation_mode != "null":
        middleware.append(disagg_middleware(disaggregation_mode, disaggregation_bootstrap_port, host, prof, time_scale))
    app = Starlette(routes=table, lifespan=lifespan, middleware=middleware)
    app.state.twin = twin
    app.state.responses_store = Store()
    return app


ENGINES = ("sglang", "vllm")
"""The dialects a twin speaks (``sim-backend --engine``)."""


def _sglang_table() -> list[Route]:
    return [
        Route("/health", native.health, methods=["GET"]),
        Route("/health_generate", native.health, methods=["GET"]),
        Route("/get_model_info", native.model_info, methods=["GET"]),
        Route("/model_info", native.model_info, methods=["GET"]),
        Route("/get_server_info", native.server_info, methods=["GET"]),
        Route("/server_info", native.server_info, methods=["GET"]),
        Route("/v1/loads", native.v1_loads, methods=["GET"]),
        Route("/metrics", native.metrics, methods=["GET"]),
        Route("/flush_cache", native.flush_cache, methods=["GET", "POST"]),
        Route("/abort_request", native.abort_request, methods=["POST"]),
        Route("/v1/tokenize", routes_tokenize.tokenize, methods=["POST"]),
        Route("/tokenize", routes_tokenize.tokenize, methods=["POST"]),
        Route("/generate", native.generate, methods=["POST", "PUT"]),
        Route("/v1/models", openai_routes.models, methods=["GET"]),
        Route("/v1/models/{model:path}", openai_routes.model, methods=["GET"]),
    ]


def _vllm_table() -> list[Route]:
    return [
        Route("/health", native.health, methods=["GET"]),
        Route("/metrics", vllm_routes.metrics, methods=["GET"]),
        Route("/version", vllm_routes.version, methods=["GET"]),
        Route("/load", vllm_routes.load, methods=["GET"]),
        Route("/v1/models", vllm_routes.models, methods=["GET"]),
    ]
