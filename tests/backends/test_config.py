"""``backends/config.py``: the pool's part of the configuration: what a backend entry may say, what it
defaults to, and what it refuses (with the field named), plus the helpers built on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme
from pydantic import ValidationError

from backends.config import (
    DEFAULT_BOOTSTRAP_PORT,
    BackendConfig,
    HealthConfig,
    KVEventsSource,
    ModelConfig,
    pd_backends,
    tls_trust,
)
from backends.engines import ENGINES, make


def test_url_scheme_trailing_slash_and_the_default_name() -> None:
    b = BackendConfig(url="http://10.0.0.5:30000/")
    assert (b.url, b.name, b.engine, b.dp_size) == ("http://10.0.0.5:30000", "10.0.0.5:30000", "auto", 1)
    assert BackendConfig(url="https://h.example/v1", name="gpu-a").name == "gpu-a"
    assert BackendConfig(url="https://h.example/v1").name == "h.example"
    with pytest.raises(ValidationError, match="must start with http:// or https://"):
        BackendConfig(url="h:1")
    with pytest.raises(ValidationError, match="extra"):
        BackendConfig(url="http://h:1", colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        BackendConfig(url="http://h:1", dp_size=0)


def test_engine_per_backend() -> None:
    assert BackendConfig(url="http://h:1").engine == "auto"
    for name in ENGINES:
        assert BackendConfig(url="http://h:1", engine=name).engine == name  # type: ignore[arg-type]
        assert make(name).name == name
    with pytest.raises(ValidationError, match="sglang"):
        BackendConfig(url="http://h:1", engine="tgi")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="no DP ranks"):
        BackendConfig(url="http://h:1", engine="openai", dp_size=2)
    assert BackendConfig(url="http://h:1", kv_tokens=500_000).kv_tokens == 500_000


def test_a_host_tier_needs_both_its_size_and_its_reload_rate() -> None:
    ok = BackendConfig(url="http://h:1", host_tier_tokens=1_000_000, host_load_tokens_per_s=1.4e6)
    assert ok.host_tier_tokens == 1_000_000
    for half in ({"host_tier_tokens": 1_000_000}, {"host_load_tokens_per_s": 1.4e6}):
        with pytest.raises(ValidationError, match="set together"):
            BackendConfig(url="http://h:1", **half)  # type: ignore[arg-type]


def test_roles_and_bootstrap_ports() -> None:
    assert BackendConfig(url="http://p:1", role="prefill", bootstrap_port=8998).bootstrap_port == 8998
    with pytest.raises(ValidationError, match="role prefill needs bootstrap_port"):
        BackendConfig(url="http://p:1", role="prefill")
    with pytest.raises(ValidationError, match="for role: prefill backends only"):
        BackendConfig(url="http://d:1", role="decode", bootstrap_port=8998)
    with pytest.raises(ValidationError):
        BackendConfig(url="http://p:1", role="prefill", bootstrap_port=70_000)


def test_a_disaggregated_model_needs_both_roles_on_every_backend() -> None:
    prefill = {"url": "http://p:1", "role": "prefill", "bootstrap_port": 8998}
    decode = {"url": "http://d:1", "role": "decode"}
    model = ModelConfig.model_validate({"backends": [prefill, decode]})
    assert model.disaggregated and not ModelConfig.model_validate({"backends": [{"url": "http://c:1"}]}).disaggregated
    with pytest.raises(ValidationError, match="each need role"):
        ModelConfig.model_validate({"backends": [prefill, decode, {"url": "http://c:1"}]})
    with pytest.raises(ValidationError, match="needs decode backends"):
        ModelConfig.model_validate({"backends": [prefill]})
    with pytest.raises(ValidationError, match="needs prefill backends"):
        ModelConfig.model_validate({"backends": [decode]})


def test_pd_flags_become_backend_entries() -> None:
    entries = pd_backends(["http://10.0.0.5:30000:9000", "http://10.0.0.6:30000"], ["http://10.0.0.7:30000"])
    assert entries == [
        {"url": "http://10.0.0.5:30000", "role": "prefill", "bootstrap_port": 9000},
        {"url": "http://10.0.0.6:30000", "role": "prefill", "bootstrap_port": DEFAULT_BOOTSTRAP_PORT},
        {"url": "http://10.0.0.7:30000", "role": "decode"},
    ]
    # a URL whose only port is its own keeps it (no bootstrap port taken from it)
    assert pd_backends(["http://h:30000"], []) == [{"url": "http://h:30000", "role": "prefill", "bootstrap_port": 8998}]
    assert ModelConfig.model_validate({"backends": entries}).disaggregated


def test_an_ipv6_prefill_url_keeps_its_own_port() -> None:
    assert pd_backends(["http://[fd00::5]:30000"], []) == [
        {"url": "http://[fd00::5]:30000", "role": "prefill", "bootstrap_port": DEFAULT_BOOTSTRAP_PORT}
    ]


def test_the_upstream_key_comes_from_its_environment_variable_first(monkeypatch: pytest.MonkeyPatch) -> None:
    b = BackendConfig(url="http://h:1", api_key="inline", api_key_env="CG_TEST_UPSTREAM_KEY")
    monkeypatch.delenv("CG_TEST_UPSTREAM_KEY", raising=False)
    assert b.upstream_key() == "inline"  # the variable unset: the inline key
    monkeypatch.setenv("CG_TEST_UPSTREAM_KEY", "from-env")
    assert b.upstream_key() == "from-env"
    monkeypatch.setenv("CG_TEST_UPSTREAM_KEY", "")
    assert b.upstream_key() == "inline"
    assert BackendConfig(url="http://h:1").upstream_key() is None


def test_a_private_ca_is_for_https_backends_and_must_be_a_pem_ca_file(tmp_path: Path) -> None:
    ca = trustme.CA()
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    b = BackendConfig(url="https://gpu.internal:8443", tls_ca_file=str(pem))
    assert b.tls_ca_file == str(pem)
    with pytest.raises(ValidationError, match="for https:// backends only"):
        BackendConfig(url="http://gpu.internal:8443", tls_ca_file=str(pem))
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ValidationError, match="not a PEM CA file"):
        BackendConfig(url="https://gpu.internal:8443", tls_ca_file=str(junk))
    with pytest.raises(ValidationError, match="not a PEM CA file"):
        BackendConfig(url="https://gpu.internal:8443", tls_ca_file=str(tmp_path / "missing.pem"))
    models = [
        ModelConfig(backends=[b, BackendConfig(url="https://public.example")]),
        ModelConfig(backends=[BackendConfig(url="https://other.internal", tls_ca_file=str(pem))]),
    ]
    assert tls_trust(models) == {("gpu.internal", 8443): str(pem), ("other.internal", 443): str(pem)}


def test_kv_events_endpoints_are_tcp_and_their_timings_are_bounded() -> None:
    src = KVEventsSource(endpoint="tcp://h:5557", replay_endpoint="tcp://h:5558")
    assert (src.topic, src.poll_s, src.tokenize_wait_s) == ("", 1.0, 0.25)
    for bad in ({"endpoint": "ipc:///tmp/x"}, {"endpoint": "tcp://h:1", "replay_endpoint": "udp://h:2"}):
        with pytest.raises(ValidationError, match="tcp://host:port"):
            KVEventsSource(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        KVEventsSource(endpoint="tcp://h:1", poll_s=0)
    assert BackendConfig(url="http://h:1", kv_events={"endpoint": "tcp://h:1"}).kv_events == KVEventsSource(  # type: ignore[arg-type]
        endpoint="tcp://h:1"
    )


def test_health_defaults_and_bounds() -> None:
    h = HealthConfig()
    assert (h.interval_s, h.timeout_s, h.load_interval_s, h.failures_to_eject) == (2.0, 5.0, 1.0, 2)
    with pytest.raises(ValidationError):
        HealthConfig(failures_to_eject=0)
    with pytest.raises(ValidationError):
        HealthConfig(interval_s=0)
