"""``backends/engines/detect.py``: ``engine: auto`` tells SGLang from vLLM by what the server answers, and
leaves a server that answers neither undetected (handled as SGLang meanwhile)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.engines import ENGINES, make
from backends.engines.base import Fetch
from backends.engines.detect import Undetected, detect
from backends.engines.sglang import SGLang
from backends.engines.vllm import VLLM
from backends.sim.server import create_app


@asynccontextmanager
async def served(app: Starlette) -> AsyncIterator[Fetch]:
    async with (
        LifespanManager(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://server") as client,
    ):

        async def get(path: str) -> httpx.Response:
            return await client.get(path)

        yield get


def _models_only() -> Starlette:
    """An OpenAI-compatible endpoint that publishes no engine signal: only the model list."""

    async def models(_: object) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    return Starlette(routes=[Route("/v1/models", models)])


async def test_an_sglang_server_is_detected_with_its_info() -> None:
    async with served(create_app("b300-dp2-bf16")) as get:
        adapter, info, error = await detect(get)
    assert isinstance(adapter, SGLang) and adapter.name == "sglang" and error is None
    assert (info.dp_ranks, info.max_model_len) == (2, 262_144) and info.kv_tokens > 0


async def test_a_vllm_server_is_detected_by_its_cache_config_series() -> None:
    async with served(create_app("b300-dp2-bf16", engine="vllm")) as get:
        adapter, info, error = await detect(get)
    assert isinstance(adapter, VLLM) and error is None
    assert info.dp_ranks == 2 and info.kv_tokens > 0
    assert info.max_running_requests == 0  # vLLM publishes no running cap


async def test_a_server_that_answers_neither_stays_undetected_and_says_why() -> None:
    async with served(_models_only()) as get:
        adapter, info, error = await detect(get)
    assert adapter is None
    assert error is not None and "/get_server_info answered 404" in error and "/metrics: " in error
    assert "/metrics answered 404" in error
    assert (info.kv_tokens, info.dp_ranks) == (0, None)


async def test_a_server_that_is_down_stays_undetected() -> None:
    async def refused(path: str) -> httpx.Response:
        raise httpx.ConnectError(f"refused {path}")

    adapter, _, error = await detect(refused)
    assert adapter is None and error == "refused /get_server_info; /metrics: refused /metrics"


def test_undetected_is_handled_as_sglang_until_detected() -> None:
    auto = make("auto")
    assert isinstance(auto, Undetected) and isinstance(auto, SGLang)
    assert auto.name == "auto"
    assert auto.health_path == SGLang.health_path and auto.pin(1) == (1, {})  # the DP rank in the body
    assert auto.native_surfaces == frozenset()  # no passthrough before the engine is known
    assert set(ENGINES) == {"sglang", "vllm", "openai", "auto"}
