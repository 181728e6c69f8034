"""The proxy over real HTTP on loopback: the official openai SDK → gateway process → scripted upstream."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest
import yaml

from tests.fake_upstream import SERVED, FakeUpstream, script_events
from tests.harness import run_gateway

KEY = "sk-test-platform"


def write_config(path: Path, *urls: str, **extra: object) -> str:
    config = {
        "models": {"kimi": {"upstream_model": SERVED, "backends": [{"url": u} for u in urls]}},
        "health": {"interval_s": 0.2, "load_interval_s": 0.5},
        "policy": "direct",
        **extra,
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def gateway(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cfg = write_config(
        tmp_path_factory.mktemp("cfg") / "c.yaml", upstream.url, max_body_bytes=4096, upstream={"idle_timeout_s": 1.0}
    )
    with run_gateway("--config", cfg, "--api-key", f"{KEY}=platform") as base:
        yield base


@pytest.fixture()
def client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key=KEY, max_retries=0)


def test_non_stream_with_openai_sdk(client: openai.OpenAI, upstream: FakeUpstream) -> None:
    reply = client.chat.completions.create(model="kimi", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "Hello, world!"
    assert reply.usage is not None and reply.usage.prompt_tokens == 11
    sent = upstream.requests[-1]
    assert sent["body"]["model"] == SERVED, "the alias must be rewritten to the upstream served name"
    assert "authorization" not in sent["headers"] and "x-api-key" not in sent["headers"]


def test_stream_with_openai_sdk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model="kimi", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello, world!"


def test_stream_bytes_identical_and_injected_usage_stripped(gateway: str, upstream: FakeUpstream) -> None:
    body = {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": "think"}]}
    with httpx.stream(
        "POST", gateway + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["x-accel-buffering"] == "no"
        assert "content-encoding" not in response.headers
        received = b"".join(response.iter_raw())
    assert upstream.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    expected = b"".join(e for e in upstream.sent if b'"choices":[]' not in e)
    assert received == expected
    assert b"reasoning_content" in received and received.endswith(b"data: [DONE]\n\n")


def test_client_usage_chunk_passes_byte_for_byte(gateway: str, upstream: FakeUpstream) -> None:
    body = {
        "model": "kimi",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}],
    }
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=body, headers={"x-api-key": KEY}) as response:
        received = b"".join(response.iter_raw())
    assert received == b"".join(upstream.sent)
    assert received == b"".join(script_events("plain", include_usage=True))


def test_tool_calls_and_reasoning_deltas_intact(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="kimi",
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "use a tool"}],
        tools=[{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
    )
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id == "functions.read_file:0" and calls[0].function.name == "read_file"
    assert "".join(tc.function.arguments or "" for tc in calls) == '{"path": "a.py"}'
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["tool_calls"]


def _raw_post(base: str, body: dict[str, object]) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    payload = orjson.dumps(body)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload
    )
    return sock


@pytest.mark.parametrize("when", ["mid-stream", "before-first-byte"])
def test_client_disconnect_closes_upstream_connection(gateway: str, upstream: FakeUpstream, when: str) -> None:
    content = "slow" if when == "mid-stream" else "stall"
    sock = _raw_post(gateway, {"model": "kimi", "stream": True, "messages": [{"role": "user", "content": content}]})
    if when == "mid-stream":
        data = b""
        while data.count(b"data:") < 5:
            data += sock.recv(65536)
    else:
        time.sleep(0.5)
    # The connection the gateway opened for this request (health checks use their own).
    deadline = time.monotonic() + 5
    conn = None
    while conn is None and time.monotonic() < deadline:
        conn = next((c for c in upstream.connections if c.streaming and c.closed is None), None)
        time.sleep(0.01)
    assert conn is not None
    left = time.monotonic()
    sock.close()
    while conn.closed is None and time.monotonic() - left < 3:
        time.sleep(0.01)
    assert conn.closed is not None and conn.closed - left < 1.0, "upstream connection must close within 1 s"


def _post(base: str, body: object, key: str | None = KEY, raw: bytes | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    if raw is not None:
        return httpx.post(base + "/v1/chat/completions", content=raw, headers=headers)
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers)


GOOD = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "raw", "status", "code", "param"),
    [
        (None, b"{not json", 400, "invalid_json", None),
        (None, b"", 400, "invalid_request", None),
        (None, b"[1, 2]", 400, "invalid_request", None),
        ({"messages": GOOD}, None, 400, "invalid_request", "model"),
        ({"model": "kimi", "messages": []}, None, 400, "invalid_request", "messages"),
        ({"model": "kimi", "messages": "hi"}, None, 400, "invalid_request", "messages"),
        ({"model": "kimi", "messages": [{"content": "x"}]}, None, 400, "invalid_request", "messages[0].role"),
        ({"model": "kimi", "messages": GOOD, "stream": "yes"}, None, 400, "invalid_request", "stream"),
        ({"model": "kimi", "messages": GOOD, "max_tokens": "many"}, None, 400, "invalid_request", "max_tokens"),
        ({"model": "kimi", "messages": GOOD, "max_tokens": 0}, None, 400, "invalid_request", "max_tokens"),
        ({"model": "kimi", "messages": GOOD, "stream_options": 1}, None, 400, "invalid_request", "stream_options"),
        ({"model": 5, "messages": GOOD}, None, 400, "invalid_request", "model"),
        ({"model": "nope", "messages": GOOD}, None, 404, "model_not_found", "model"),
    ],
)
def test_bad_requests_get_openai_envelope(
    gateway: str, body: object, raw: bytes | None, status: int, code: str, param: str | None
) -> None:
    response = _post(gateway, body, raw=raw)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == param
    assert error["message"] and error["type"]


def test_oversized_body_is_413(gateway: str) -> None:
    big = {"model": "kimi", "messages": [{"role": "user", "content": "x" * 5000}]}
    response = _post(gateway, big)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_oversized_chunked_body_is_413(gateway: str) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "kimi", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    response = httpx.post(gateway + "/v1/chat/completions", content=chunks(), headers={"x-api-key": KEY})
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_api_key"),
        ({"authorization": "Bearer wrong"}, "invalid_api_key"),
        ({"x-api-key": "wrong"}, "invalid_api_key"),
    ],
)
def test_bad_keys_are_401(gateway: str, headers: dict[str, str], code: str) -> None:
    response = httpx.post(gateway + "/v1/chat/completions", json={"model": "kimi", "messages": GOOD}, headers=headers)
    assert response.status_code == 401 and response.json()["error"]["code"] == code


def test_unknown_route_and_method(gateway: str) -> None:
    response = httpx.get(gateway + "/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"
    response = httpx.get(gateway + "/v1/chat/completions")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_models_lists_aliases(gateway: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["kimi"]
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("other")
    assert info.value.code == "model_not_found"


def test_upstream_error_is_reshaped_with_its_status(gateway: str, upstream: FakeUpstream) -> None:
    upstream.error_status = 400
    try:
        response = _post(gateway, {"model": "kimi", "messages": GOOD, "stream": True})
    finally:
        upstream.error_status = None
    assert response.status_code == 400
    # SGLang's flat {"object": "error", ...} becomes the OpenAI envelope the README promises
    assert response.json() == {
        "error": {"message": "scripted failure", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert httpx.get(gateway + "/readyz").status_code == 200, "a 4xx never takes a backend out"


def test_upstream_silence_is_504(gateway: str) -> None:
    response = _post(gateway, {"model": "kimi", "messages": [{"role": "user", "content": "stall"}]})
    assert response.status_code == 504 and response.json()["error"]["code"] == "upstream_timeout"


def test_unhealthy_backend_is_skipped_and_comes_back(tmp_path: Path) -> None:
    a, b = FakeUpstream(), FakeUpstream()
    with a.running(), b.running(), run_gateway("--config", write_config(tmp_path / "c.yaml", a.url, b.url)) as base:
        a.healthy = False
        deadline = time.monotonic() + 5
        while httpx.get(base + "/readyz").json()["backends"][f"127.0.0.1:{a.port}"]["healthy"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        before_a, before_b = len(a.requests), len(b.requests)
        for _ in range(6):
            assert _post(base, {"model": "kimi", "messages": GOOD}, key=None).status_code == 200
        assert len(a.requests) == before_a and len(b.requests) == before_b + 6
        a.healthy = b.healthy = False
        while httpx.get(base + "/readyz").status_code != 503:
            assert time.monotonic() < deadline + 5
            time.sleep(0.05)
        refused = _post(base, {"model": "kimi", "messages": GOOD}, key=None)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_healthy_backend"
        assert "retry-after" in refused.headers
        a.healthy = b.healthy = True
        while httpx.get(base + "/readyz").status_code != 200:
            assert time.monotonic() < deadline + 10
            time.sleep(0.05)
        time.sleep(0.5)
        for _ in range(6):
            assert _post(base, {"model": "kimi", "messages": GOOD}, key=None).status_code == 200
        assert len(a.requests) > before_a, "the recovered backend is used again"


def test_connection_failure_retries_on_another_backend_then_502(tmp_path: Path) -> None:
    a, b = FakeUpstream(), FakeUpstream()
    cfg = tmp_path / "c.yaml"
    config = yaml.safe_load(Path(write_config(cfg, "http://placeholder")).read_text())
    with b.running(), a.running():
        config["models"]["kimi"]["backends"] = [{"url": a.url}, {"url": b.url}]
        config["health"]["interval_s"] = 60  # nothing but the requests themselves notices a death
        cfg.write_text(yaml.safe_dump(config))
        with run_gateway("--config", str(cfg)) as base:
            for _ in range(2):
                assert _post(base, {"model": "kimi", "messages": GOOD}, key=None).status_code == 200
            a.stop()
            served_by_b = len(b.requests)
            for _ in range(4):  # whichever backend round-robin picks, the request succeeds
                assert _post(base, {"model": "kimi", "messages": GOOD}, key=None).status_code == 200
            assert len(b.requests) == served_by_b + 4
            assert httpx.get(base + "/readyz").json()["backends"][f"127.0.0.1:{a.port}"]["healthy"] is False
            b.stop()
            failed = _post(base, {"model": "kimi", "messages": GOOD}, key=None)
            assert failed.status_code in (502, 503)
            assert failed.json()["error"]["code"] in ("upstream_unreachable", "no_healthy_backend")
            metrics = httpx.get(base + "/metrics").text
            assert f'cachegate_upstream_errors_total{{backend="127.0.0.1:{a.port}",kind="connect"}}' in metrics


def test_backend_api_key_is_sent_upstream(tmp_path: Path) -> None:
    up = FakeUpstream()
    with up.running():
        config = {"models": {"kimi": {"backends": [{"url": up.url, "api_key_env": "UPSTREAM_KEY"}]}}}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
        with run_gateway(
            "--config", str(tmp_path / "c.yaml"), "--api-key", "client-key", env={"UPSTREAM_KEY": "sglang-secret"}
        ) as base:
            assert _post(base, {"model": "kimi", "messages": GOOD}, key="client-key").status_code == 200
        headers = up.requests[-1]["headers"]
        assert headers["authorization"] == "Bearer sglang-secret"
        assert up.requests[-1]["body"]["model"] == "kimi", "without upstream_model the alias is the served name"
