"""Configuration, keys and request parsing: pure units."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest
from starlette.datastructures import Headers

from gateway.config.schema import hash_key, load_config
from gateway.http.errors import GatewayError
from gateway.request.auth import KeyStore, check_token
from gateway.surfaces.openai import parse, upstream_body
from tests.harness import CACHEGATE, ROOT

EXAMPLE = ROOT / "deploy" / "cachegate.example.yaml"


def test_example_config_loads() -> None:
    config = load_config(EXAMPLE)
    assert config.models["kimi-k2"].upstream_model == "moonshotai/Kimi-K2-Instruct"
    assert config.models["kimi-k2"].backends[0].dp_size == 8
    assert config.teams["platform"].max_concurrency == 32
    assert config.policy == "gateway"


def test_flags_beat_env_beat_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: {host: 0.0.0.0, port: 9000}\nredis_url: redis://file/0\n")
    monkeypatch.setenv("CACHEGATE_PORT", "9100")
    monkeypatch.setenv("CACHEGATE_REDIS_URL", "redis://env/1")
    config = load_config(path)
    assert (config.listen.host, config.listen.port, config.redis_url) == ("0.0.0.0", 9100, "redis://env/1")
    config = load_config(path, port=9200, redis_url="redis://flag/2")
    assert (config.listen.port, config.redis_url) == (9200, "redis://flag/2")


def test_quick_start_flags() -> None:
    config = load_config(backends=["http://127.0.0.1:30000/"], model="kimi", api_keys=["k1", "k2=platform"])
    assert config.models["kimi"].upstream_model == "kimi"
    assert config.models["kimi"].backends[0].url == "http://127.0.0.1:30000"
    assert config.models["kimi"].backends[0].name == "127.0.0.1:30000"
    assert [(k.sha256, k.team) for k in config.keys] == [(hash_key("k1"), "default"), (hash_key("k2"), "platform")]
    assert "default" in config.teams


@pytest.mark.parametrize(
    "text",
    [
        "models: {m: {backends: [{url: ftp://x}]}}",
        "unknown_field: 1",
        "keys: [{sha256: abc}]",
        "teams: {a: {max_concurrency: -1}}",
        "- a list",
    ],
)
def test_invalid_config_is_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError):
        load_config(path)


def test_backend_without_model_is_rejected() -> None:
    with pytest.raises(ValueError, match="--model"):
        load_config(backends=["http://a:1"])


def test_keys_map_to_teams_and_open_mode() -> None:
    store = KeyStore(load_config(backends=["http://a:1"], model="m", api_keys=["secret=platform"]))
    assert store.team_for(Headers({"authorization": "Bearer secret"})) == "platform"
    assert store.team_for(Headers({"x-api-key": "secret"})) == "platform"
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic c2VjcmV0"}):
        with pytest.raises(GatewayError) as info:
            store.team_for(Headers(headers))
        assert info.value.status == 401
    open_store = KeyStore(load_config(backends=["http://a:1"], model="m"))
    assert open_store.open and open_store.team_for(Headers({})) == "default"


def test_admin_token_check() -> None:
    assert check_token("t0ken", "t0ken")
    assert not check_token("t0ken", "other") and not check_token(None, "x") and not check_token("x", None)


def test_usage_injection_only_when_client_did_not_ask() -> None:
    req = parse(b'{"model": "a", "stream": true, "messages": [{"role": "user", "content": "hi"}]}', "chat")
    body, injected = upstream_body(req, "served")
    assert injected and b'"include_usage":true' in body and b'"model":"served"' in body
    req = parse(
        b'{"model": "a", "stream": true, "stream_options": {"include_usage": true},'
        b' "messages": [{"role": "user", "content": "hi"}]}',
        "chat",
    )
    assert upstream_body(req, "served")[1] is False
    req = parse(b'{"model": "a", "messages": [{"role": "user", "content": "hi"}]}', "chat")
    body, injected = upstream_body(req, "served", rank=3)
    assert not injected and b"stream_options" not in body and b'"routed_dp_rank":3' in body


def test_completions_prompt_checks() -> None:
    for good in (b'"def f():"', b"[1, 2, 3]", b'["a", "b"]', b"[[1, 2], [3]]"):
        assert parse(b'{"model": "a", "prompt": %s}' % good, "completion").body["prompt"] == orjson.loads(good)
    for bad in (b'{"model": "a"}', b'{"model": "a", "prompt": ""}', b'{"model": "a", "prompt": {}}'):
        with pytest.raises(GatewayError) as info:
            parse(bad, "completion")
        assert info.value.status == 400 and info.value.param == "prompt"


def test_workers_without_redis_refuse_to_start() -> None:
    proc = subprocess.run(
        [*CACHEGATE, "serve", "--workers", "2", "--backend", "http://127.0.0.1:9", "--model", "m"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode != 0 and "needs Redis" in proc.stderr


def test_aliases_exact_then_patterns_and_targets_checked() -> None:
    from gateway.config.schema import Config

    cfg = Config.model_validate(
        {
            "models": {"kimi": {}, "small": {}},
            "aliases": {"claude-haiku-4-5": "small", "claude-*": "kimi", "gpt-?": "kimi"},
        }
    )
    assert cfg.resolve_model("kimi") == "kimi"
    assert cfg.resolve_model("claude-haiku-4-5") == "small"  # the exact name wins over the pattern
    assert cfg.resolve_model("claude-sonnet-4-6") == "kimi"
    assert cfg.resolve_model("gpt-5") == "kimi" and cfg.resolve_model("gpt-55") is None
    assert cfg.resolve_model("llama") is None
    with pytest.raises(ValueError, match="alias 'x' names model 'nope'"):
        Config.model_validate({"models": {"kimi": {}}, "aliases": {"x": "nope"}})


def test_surface_mode_per_backend() -> None:
    from backends.config import BackendConfig
    from backends.pool import Backend

    plain = Backend("kimi", BackendConfig(url="http://a:1"), "kimi")
    assert plain.mode("responses", "/v1/responses") == "translate"  # the default
    auto = Backend("kimi", BackendConfig(url="http://a:1"), "kimi", model_surfaces={"responses": "auto"})
    assert auto.mode("responses", "/v1/responses") == "translate"  # /openapi.json not read yet
    auto.routes = frozenset({"/v1/chat/completions", "/v1/responses"})
    assert auto.mode("responses", "/v1/responses") == "passthrough"
    assert auto.mode("messages", "/v1/messages") == "translate"
    own = Backend(
        "kimi",
        BackendConfig(url="http://a:1", surfaces={"responses": "translate"}),
        "kimi",
        model_surfaces={"responses": "passthrough"},
    )
    assert own.mode("responses", "/v1/responses") == "translate"  # the backend's own setting wins
