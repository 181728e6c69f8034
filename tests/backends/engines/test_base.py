"""``backends/engines/base.py``: the adapter interface's defaults are an engine that publishes nothing,
and every adapter is made fresh per backend (one that turns counters into rates keeps its own reading)."""

from __future__ import annotations

import httpx
import pytest

from backends.engines import ENGINES, EngineAdapter, make
from backends.engines.base import READ_ERRORS, Info, Load, Reply
from backends.engines.vllm import VLLM


async def test_the_defaults_publish_nothing_and_pin_the_rank_in_the_body() -> None:
    async def get(path: str) -> Reply:
        raise AssertionError("the default adapter reads nothing")

    base = EngineAdapter()
    info, error = await base.read_info(get)
    assert info == Info() and error == "the engine publishes no self-description"
    assert await base.read_load(get) is None
    assert base.pin(4) == (4, {}) and base.pin(None) == (None, {})
    assert (base.name, base.health_path, base.native_surfaces, base.info_route) == ("none", "/health", frozenset(), "")


def test_empty_records_mean_not_said() -> None:
    assert (Info().kv_tokens, Info().dp_ranks, Info().max_running_requests, Info().max_model_len) == (0, None, 0, 0)
    assert Load() == Load(running=0, waiting=0, token_usage=0.0, cache_hit_rate=0.0, kv_tokens=0, ranks=0)


@pytest.mark.parametrize("exc", [httpx.ReadTimeout("t"), ValueError("v"), TypeError("t"), AttributeError("a"),
                                 KeyError("k"), httpx.RemoteProtocolError("p")])  # fmt: skip
def test_read_errors_cover_the_transport_and_a_malformed_answer(exc: Exception) -> None:
    assert isinstance(exc, READ_ERRORS)


def test_a_programming_error_is_not_a_read_error() -> None:
    assert not isinstance(ZeroDivisionError(), READ_ERRORS) and not isinstance(RuntimeError(), READ_ERRORS)


def test_make_gives_each_backend_its_own_adapter() -> None:
    for name in ENGINES:
        one, two = make(name), make(name)
        assert one is not two and one.name == name
    first, second = make("vllm"), make("vllm")
    assert isinstance(first, VLLM) and isinstance(second, VLLM)
    first._counted = (10.0, 5.0)
    assert second._counted is None  # another backend's previous reading never leaks into this one's rate
