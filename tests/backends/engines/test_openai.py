"""``backends/engines/openai.py``: an endpoint that publishes nothing is in rotation while ``/v1/models``
answers, is never asked for a self-description or a load, and is never given a DP rank."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.engines import make
from backends.engines.base import Info, Reply
from backends.engines.openai import OpenAICompatible


async def test_its_health_route_is_the_model_list_a_hosted_endpoint_serves_without_health() -> None:
    async def models(_: object) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "gpt-x", "object": "model"}]})

    hosted = Starlette(routes=[Route("/v1/models", models)])  # no /health, no engine signal
    adapter = make("openai")
    assert isinstance(adapter, OpenAICompatible) and adapter.name == "openai"
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=hosted), base_url="http://h") as client:
        assert (await client.get(adapter.health_path)).status_code == 200
        assert (await client.get("/health")).status_code == 404


async def test_nothing_is_read_from_it() -> None:
    asked: list[str] = []

    async def get(path: str) -> Reply:
        asked.append(path)
        raise httpx.ConnectError("must not be called")

    adapter = OpenAICompatible()
    info, error = await adapter.read_info(get)
    assert (info, error) == (Info(), None)  # "read" at once: never asked again
    assert await adapter.read_load(get) is None
    assert asked == []


def test_a_rank_is_never_pinned_and_no_native_surface_is_assumed() -> None:
    assert OpenAICompatible().pin(3) == (None, {})
    assert OpenAICompatible().pin(None) == (None, {})
    assert OpenAICompatible.native_surfaces == frozenset()
