"""``backends/backend.py``: one backend's record: its name, whether it is in rotation (health checks and
breaker), the breaker state it shows, the upstream key it sends, how it answers each client surface,
and the view the decision core routes over."""

from __future__ import annotations

import pytest

from backends.backend import DEFAULT_MODE, Backend
from backends.config import BackendConfig
from backends.engines import make
from policies.breaker import STATE_CODE, Breaker
from policies.types import BackendView


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def backend(clock: Clock | None = None, **config: object) -> Backend:
    cfg = BackendConfig.model_validate({"url": "http://10.0.0.5:30000", **config})
    return Backend("kimi", cfg, "served/kimi", clock=clock or Clock(), breaker=Breaker(open_s=5.0))


def test_name_url_dp_size_and_engine() -> None:
    b = backend(dp_size=4)
    assert (b.name, b.url, b.dp_size) == ("10.0.0.5:30000", "http://10.0.0.5:30000", 4)
    assert backend(name="gpu-a").name == "gpu-a"
    assert b.engine == "auto"  # undetected until its first health check
    b.adapter = make("vllm")
    assert b.engine == "vllm"


def test_in_rotation_needs_a_passed_health_check_and_a_closed_breaker() -> None:
    clock = Clock()
    b = backend(clock)
    assert not b.healthy and b.breaker_state == STATE_CODE["open"]  # never checked: out, and shown open
    b.health_ok = True
    assert b.healthy and b.breaker_state == STATE_CODE["closed"]
    b.breaker.trip(clock.now)
    assert not b.healthy and b.breaker_state == STATE_CODE["open"]
    clock.now += 5.0  # open_s later: half-open, still out of rotation until a probe succeeds
    assert not b.healthy and b.breaker_state == STATE_CODE["half_open"]
    b.breaker.success(clock.now)
    assert b.healthy and b.breaker_state == STATE_CODE["closed"]
    b.health_ok = False  # failed health checks show as open whatever the breaker says
    assert b.breaker_state == STATE_CODE["open"]


def test_the_upstream_key_goes_in_a_bearer_header_and_nothing_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backend().headers() == {}
    assert backend(api_key="sk-up").headers() == {"authorization": "Bearer sk-up"}
    monkeypatch.setenv("CG_TEST_BACKEND_KEY", "sk-env")
    assert backend(api_key="sk-up", api_key_env="CG_TEST_BACKEND_KEY").headers() == {"authorization": "Bearer sk-env"}


def test_surface_modes_backend_config_then_model_then_translate() -> None:
    b = backend()
    assert b.mode("responses", "/v1/responses") == DEFAULT_MODE == "translate"
    b.model_surfaces = {"responses": "passthrough", "messages": "auto"}
    assert b.mode("responses", "/v1/responses") == "passthrough"
    own = backend(surfaces={"responses": "translate"})
    own.model_surfaces = {"responses": "passthrough"}
    assert own.mode("responses", "/v1/responses") == "translate"  # the backend's own setting wins


def test_auto_passes_through_only_what_the_backends_openapi_lists() -> None:
    b = backend(surfaces={"messages": "auto"})
    assert b.routes is None
    assert b.mode("messages", "/v1/messages") == "translate"  # not read yet
    b.routes = frozenset({"/v1/chat/completions"})
    assert b.mode("messages", "/v1/messages") == "translate"
    b.routes = frozenset({"/v1/chat/completions", "/v1/messages"})
    assert b.mode("messages", "/v1/messages") == "passthrough"


def test_the_view_carries_what_the_pool_last_learned() -> None:
    b = backend(dp_size=2)
    b.health_ok = True
    b.max_total_num_tokens, b.running, b.waiting, b.token_usage = 500_000, 3, 1, 0.4
    b.max_running_requests, b.host_tokens, b.reload_tokens_per_s, b.max_model_len = 48, 1_000_000, 1.4e6, 262_144
    assert b.view() == BackendView(
        "10.0.0.5:30000",
        True,
        500_000,
        2,
        3,
        1,
        0.4,
        max_running_requests=48,
        host_tokens=1_000_000,
        reload_tokens_per_s=1.4e6,
        context_tokens=262_144,
    )
    b.breaker.trip(b.clock())
    assert b.view().healthy is False
