"""``backends/engines/sglang.py``: SGLang 0.5.23's ``/get_server_info``, ``/get_model_info`` and ``/v1/loads``
as the adapter reads them, from hand-made payloads and over HTTP from the twin (SGLang's own shapes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from backends.engines.base import Fetch, Reply
from backends.engines.sglang import SGLang, parse_loads, parse_server_info
from backends.sim.profiles import get_profile
from backends.sim.server import create_app


def test_sglang_loads_as_before() -> None:
    loads = {
        "loads": [
            {"num_running_reqs": 2, "num_waiting_reqs": 1, "token_usage": 0.5, "cache_hit_rate": 0.8,
             "max_total_num_tokens": 1000},
            {"num_running_reqs": 3, "num_waiting_reqs": 0, "token_usage": 0.7, "cache_hit_rate": 0.6},
        ]
    }  # fmt: skip
    load = parse_loads(loads)
    assert load is not None
    assert (load.running, load.waiting, load.token_usage, load.kv_tokens) == (5, 1, 0.7, 1000)
    assert load.cache_hit_rate == pytest.approx(0.7)
    assert parse_loads({"loads": []}) is None


def test_loads_with_missing_and_null_fields_count_as_zero() -> None:
    load = parse_loads({"loads": [{"num_running_reqs": None}, {"token_usage": 0.25}]})
    assert load is not None
    assert (load.running, load.waiting, load.token_usage, load.cache_hit_rate, load.kv_tokens, load.ranks) == (
        0, 0, 0.25, 0.0, 0, 2,
    )  # fmt: skip
    assert parse_loads({}) is None and parse_loads({"loads": None}) is None


def test_server_info_fields_and_their_fallbacks() -> None:
    info = parse_server_info(
        {"max_total_num_tokens": 5000, "dp_size": 4, "max_running_requests": 48, "max_model_len": 8192}
    )
    assert (info.kv_tokens, info.dp_ranks, info.max_running_requests, info.max_model_len) == (5000, 4, 48, 8192)
    # context_length when max_model_len is absent; no dp_size (or null) is "not said", not 0 ranks
    bare = parse_server_info({"context_length": 4096, "dp_size": None, "max_total_num_tokens": None})
    assert (bare.kv_tokens, bare.dp_ranks, bare.max_running_requests, bare.max_model_len) == (0, None, 0, 4096)


@pytest.fixture()
async def twin() -> AsyncIterator[httpx.AsyncClient]:
    app = create_app("b300-dp2-bf16", time_scale=1.0, stream_interval_s=0.0)
    async with (
        LifespanManager(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://twin") as client,
    ):
        yield client


def _fetch(client: httpx.AsyncClient, overrides: dict[str, Reply] | None = None) -> Fetch:
    async def get(path: str) -> Reply:
        if overrides and path in overrides:
            return overrides[path]
        return await client.get(path)

    return get


class _Json:
    """A whole answer with a status and a JSON body (the ``Reply`` protocol)."""

    def __init__(self, status: int, payload: Any) -> None:
        self.status_code, self.payload = status, payload

    @property
    def content(self) -> bytes:
        return b""

    def json(self) -> Any:
        return self.payload


async def test_reads_a_dp_servers_self_description(twin: httpx.AsyncClient) -> None:
    p = get_profile("b300-dp2-bf16")
    info, error = await SGLang().read_info(_fetch(twin))
    assert error is None
    assert (info.kv_tokens, info.dp_ranks, info.max_running_requests) == (p.kv_tokens, 2, p.max_running_requests)
    assert info.max_model_len == 262_144


async def test_the_model_infos_window_wins_and_is_read_even_when_the_server_info_fails(
    twin: httpx.AsyncClient,
) -> None:
    model_info = {"/get_model_info": _Json(200, {"max_model_len": 32_768})}
    info, error = await SGLang().read_info(_fetch(twin, model_info))
    assert error is None and info.max_model_len == 32_768
    broken = {"/get_server_info": _Json(500, {}), **model_info}
    info, error = await SGLang().read_info(_fetch(twin, broken))
    assert error == "/get_server_info answered 500"
    assert (info.kv_tokens, info.max_model_len) == (0, 32_768)
    # a model info without the field keeps the server's figure
    info, _ = await SGLang().read_info(_fetch(twin, {"/get_model_info": _Json(200, {})}))
    assert info.max_model_len == 262_144


async def test_unreadable_answers_are_an_error_never_an_exception() -> None:
    async def refused(path: str) -> Reply:
        raise httpx.ConnectError("refused")

    info, error = await SGLang().read_info(refused)
    assert error == "refused" and info.kv_tokens == 0

    async def a_list(path: str) -> Reply:
        return _Json(200, ["not", "an", "object"])

    info, error = await SGLang().read_info(a_list)
    assert error  # AttributeError from .get on a list, named
    assert info.max_model_len == 0


async def test_load_polls_count_the_running_requests_of_every_rank(twin: httpx.AsyncClient) -> None:
    adapter, get = SGLang(), _fetch(twin)
    idle = await adapter.read_load(get)
    assert idle is not None and (idle.ranks, idle.running, idle.waiting) == (2, 0, 0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "ignore_eos": True}
    chat = asyncio.create_task(twin.post("/v1/chat/completions", json={**body, "routed_dp_rank": 1}))
    seen = 0
    for _ in range(100):
        load = await adapter.read_load(get)
        assert load is not None
        seen = max(seen, load.running)
        if seen or chat.done():
            break
        await asyncio.sleep(0.005)
    assert (await chat).status_code == 200
    assert seen == 1
    assert load.kv_tokens == get_profile("b300-dp2-bf16").kv_tokens


async def test_a_load_route_that_does_not_answer_200_raises(twin: httpx.AsyncClient) -> None:
    with pytest.raises(ValueError, match="/v1/loads answered 503"):
        await SGLang().read_load(_fetch(twin, {"/v1/loads": _Json(503, {})}))


def test_pins_a_rank_in_the_body_and_serves_the_native_surfaces() -> None:
    assert SGLang().pin(2) == (2, {}) and SGLang().pin(None) == (None, {})
    assert SGLang.native_surfaces == {"responses", "messages"}
    assert (SGLang.health_path, SGLang.info_route) == ("/health", "/get_server_info")
