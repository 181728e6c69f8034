"""Fuzz the whole gateway: generated bodies, header sets, paths and methods through the ASGI app
(in process, for speed) in front of a real twin. No response is ever 500 or above, and every error
the gateway makes is in the surface's envelope (OpenAI's; Anthropic's on /v1/messages).

``CACHEGATE_FUZZ_CASES`` sets the number of cases (default 2,000; the acceptance run is 10,000:
``CACHEGATE_FUZZ_CASES=10000 .venv/bin/python -m pytest -q -p no:cacheprovider tests/gateway/test_gateway_fuzz.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.sim.testing import run_twin
from gateway.app import create_app
from gateway.config.schema import Config, hash_key

CASES = int(os.environ.get("CACHEGATE_FUZZ_CASES", "2000"))
KEYS = {"key-a": "a", "key-b": "b"}
ADMIN = "fuzz-admin"

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30)
json_values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=8), c, max_size=5), max_leaves=15
)
roles = st.sampled_from(["user", "assistant", "system", "tool", "developer", ""]) | json_values
message = st.fixed_dictionaries(
    {},
    optional={
        "role": roles,
        "content": st.text(max_size=200) | json_values,
        "tool_calls": json_values,
        "name": json_values,
        "tool_call_id": json_values,
    },
)
good_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=300)})
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["m", "m", "m", "other", ""]) | json_values,
        "messages": st.lists(good_message, min_size=1, max_size=3)
        | st.lists(message | json_values, max_size=4)
        | json_values,
        "prompt": st.text(max_size=200) | st.lists(st.integers(0, 50_000), max_size=20) | json_values,
        "stream": st.booleans() | json_values,
        "stream_options": st.just({"include_usage": True}) | json_values,
        "max_tokens": st.integers(1, 16) | json_values,
        "max_completion_tokens": json_values,
        "tools": json_values,
        "temperature": json_values,
        "user": json_values,
        "n": json_values,
        "stop": json_values,
    },
)


@st.composite
def nested(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(1, 1500))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    inner = opener * depth + b"1" + closer * depth
    return b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":' + inner + b"}"


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["json", "json", "json", "nested", "bytes", "huge_string", "numbers"]))
    if kind == "json":
        return json.dumps(draw(bodies)).encode()  # the stdlib writes integers orjson refuses, as a client may
    if kind == "nested":
        return draw(nested())
    if kind == "huge_string":
        n = draw(st.sampled_from([10, 100_000, 200_000]))
        return json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "word " * n}],
                "max_tokens": draw(st.integers(1, 40_000)),
            }
        ).encode()
    if kind == "numbers":
        return json.dumps({"model": "m", "prompt": list(range(draw(st.integers(0, 70_000)))), "max_tokens": 2}).encode()
    return draw(st.binary(max_size=64))


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
auth_value = (
    st.sampled_from(
        [
            "Bearer key-a",
            "Bearer key-b",
            "Bearer",
            "Bearer  ",
            "Basic eA==",
            "key-a",
            f"Bearer {ADMIN}",
            "bearer key-b",
            "",
        ]
    )
    | header_text
)
fuzzed_headers = st.fixed_dictionaries(
    {},
    optional={
        "authorization": auth_value,
        "x-api-key": st.sampled_from(["key-a", "", "nope"]) | header_text,
        "api-key": st.sampled_from(["key-b", "", " "]) | header_text,
        "content-type": st.sampled_from(["application/json", "text/plain", "", "application/json; charset=utf-8"]),
        "accept": st.sampled_from(["*/*", "text/event-stream", "application/openmetrics-text"]) | header_text,
        "traceparent": st.sampled_from(["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]) | header_text,
        "x-fuzz": header_text,
    },
)
# Half the sets also carry a valid key in api-key: whatever else they hold must not hide it.
headers = st.tuples(fuzzed_headers, st.booleans()).map(lambda t: {**t[0], "api-key": "key-a"} if t[1] else t[0])
targets = st.sampled_from(
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/m"),
        ("GET", "/v1/models/x%00"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/admin/state"),
        ("PUT", "/admin/teams/a"),
        ("GET", "/admin/teams/zz"),
        ("DELETE", "/v1/chat/completions"),
        ("GET", "/nope"),
        ("POST", "/v1/responses"),
        ("POST", "/v1/messages"),
    ]
)


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[asyncio.AbstractEventLoop, httpx.AsyncClient, Counter[Any]]]:
    with run_twin("tiny", time_scale=0.002) as twin:
        config = Config.model_validate(
            {
                "models": {"m": {"upstream_model": "moonshotai/Kimi-K2-Instruct", "backends": [{"url": twin}]}},
                "keys": [{"sha256": hash_key(k), "team": t} for k, t in KEYS.items()],
                "teams": {"a": {"max_concurrency": 4, "max_request_tokens": 20_000}, "b": {"max_concurrency": 4}},
                # The loop runs only while a case runs: between cases hypothesis holds it, which the lag
                # monitor would read as an overloaded worker (shedding has its own tests).
                "overload": {"max_lag_ms": 3_600_000},
            }
        )
        app = create_app(config, admin_token=ADMIN)
        gw = app.state.gateway
        loop = asyncio.new_event_loop()
        loop.run_until_complete(gw.start())
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=60)
        try:
            yield loop, client, Counter()
        finally:
            loop.run_until_complete(client.aclose())
            loop.run_until_complete(gw.stop())
            loop.close()


def _check(method: str, path: str, response: httpx.Response) -> None:
    assert response.status_code < 500, (method, path, response.status_code, response.text[:300])
    if response.status_code < 400:
        return
    body: Any = response.json()
    if path == "/v1/messages":  # Anthropic's envelope, the code in a header
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
        return
    if path in ("/v1/chat/completions", "/v1/completions") and body.get("object") == "error":
        assert isinstance(body.get("message"), str), body  # the engine's own refusal, relayed as it came
        return
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)


@pytest.mark.timeout(120 + CASES // 10)
@settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
@given(targets, raw_bodies(), headers)
def test_no_body_or_header_set_makes_a_5xx(
    gateway: Any, target: tuple[str, str], raw: bytes, hdrs: dict[str, str]
) -> None:
    loop, client, statuses = gateway
    method, path = target
    content = raw if method in ("POST", "PUT") else None
    response = loop.run_until_complete(client.request(method, path, content=content, headers=hdrs))
    statuses[response.status_code] += 1
    _check(method, path, response)
    if response.status_code >= 400 and "error" in response.json():
        statuses[response.json()["error"].get("code") or response.headers.get("x-cachegate-code")] += 1


def test_the_fuzz_reached_every_outcome(gateway: Any) -> None:
    """Runs after the fuzz (file order): it got answers, refusals and auth failures, not only one kind."""
    _, _, statuses = gateway
    assert statuses[200] > 0 and statuses[400] > 0 and statuses[401] > 0, statuses
    print(f"fuzz statuses and codes: {dict(statuses)}")
