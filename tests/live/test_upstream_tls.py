"""TLS to the upstream: a twin behind HTTPS with a certificate from a private CA. With the CA named in the
backend's ``tls_ca_file`` the gateway verifies it and everything crosses TLS (health checks, the engine's
capacity, streamed and whole answers); without it the certificate is refused: the backend is unhealthy, the
client gets a clear 503 in OpenAI's envelope and the log says why. A certificate for another host name is
refused too, whatever the CA."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import trustme
import yaml

from backends.config import BackendConfig
from backends.sim.testing import run_twin, twin_of
from tests.harness import run_gateway

ADMIN = {"authorization": "Bearer t0ken"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A private CA, a certificate for 127.0.0.1 and one for another name, as PEM files."""
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    files = {"ca": root / "ca.pem", "cert": root / "cert.pem", "key": root / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    served = ca.issue_cert("127.0.0.1")
    served.private_key_pem.write_to_path(str(files["key"]))
    served.cert_chain_pems[0].write_to_path(str(files["cert"]))
    other = ca.issue_cert("elsewhere.example")
    files["other_cert"], files["other_key"] = root / "other.pem", root / "other-key.pem"
    other.cert_chain_pems[0].write_to_path(str(files["other_cert"]))
    other.private_key_pem.write_to_path(str(files["other_key"]))
    return files


@pytest.fixture(scope="module")
def https_twin(pki: dict[str, Path]) -> Iterator[str]:
    with run_twin(
        "tiny", model="kimi", time_scale=0.02, tls=(str(pki["cert"]), str(pki["key"]), str(pki["ca"]))
    ) as url:
        yield url


def config(tmp_path: Path, url: str, ca_file: Path | None) -> Path:
    backend: dict[str, object] = {"url": url, "name": "tls0"}
    if ca_file is not None:
        backend["tls_ca_file"] = str(ca_file)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": {"kimi": {"backends": [backend]}}}))
    return path


def test_a_backend_behind_tls_with_its_ca_serves_everything_over_tls(
    tmp_path: Path, pki: dict[str, Path], https_twin: str
) -> None:
    assert https_twin.startswith("https://")
    before = twin_of(https_twin).engine.counters.requests
    with run_gateway("--config", str(config(tmp_path, https_twin, pki["ca"])), "--admin-token", "t0ken") as base:
        state = httpx.get(base + "/admin/state", headers=ADMIN).json()["backends"]["tls0"]
        assert state["healthy"] is True  # the health check crossed TLS
        assert state["capacity"]["kv_tokens_per_rank"] == twin_of(https_twin).engine.max_total_num_tokens
        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        whole = client.chat.completions.create(model="kimi", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert whole.choices[0].message.content
        stream = client.chat.completions.create(
            model="kimi", max_tokens=8, stream=True, messages=[{"role": "user", "content": "hi again"}]
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert twin_of(https_twin).engine.counters.requests - before == 2


@pytest.mark.parametrize("case", ["system trust store", "certificate for another name"])
def test_a_certificate_the_gateway_cannot_verify_is_refused_with_a_clear_error(
    tmp_path: Path, pki: dict[str, Path], https_twin: str, case: str
) -> None:
    if case == "system trust store":  # the private CA is not named: the system's store does not know it
        server: contextlib.AbstractContextManager[str] = contextlib.nullcontext(https_twin)
        ca_file = None
    else:  # the CA is named, but the certificate is for another host
        other = (str(pki["other_cert"]), str(pki["other_key"]), str(pki["ca"]))
        server, ca_file = run_twin("tiny", model="kimi", time_scale=0.02, tls=other, wait=False), pki["ca"]
    with (
        server as url,
        run_gateway(
            "--config", str(config(tmp_path, url, ca_file)), "--admin-token", "t0ken", ready_path="/healthz"
        ) as base,
    ):
        state = httpx.get(base + "/admin/state", headers=ADMIN).json()["backends"]["tls0"]
        answer = httpx.post(
            base + "/v1/chat/completions",
            json={"model": "kimi", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        output = base.output()
    assert state["healthy"] is False
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["type"] and error["message"] and "Traceback" not in answer.text
    assert "CERTIFICATE_VERIFY_FAILED" in output or "certificate verify failed" in output, output[-2000:]


def test_tls_ca_file_is_checked_when_the_config_is_read(tmp_path: Path, pki: dict[str, Path]) -> None:
    assert BackendConfig(url="https://10.0.0.5:443", tls_ca_file=str(pki["ca"])).tls_ca_file == str(pki["ca"])
    with pytest.raises(ValueError, match="for https:// backends only"):
        BackendConfig(url="http://10.0.0.5:30000", tls_ca_file=str(pki["ca"]))
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate")
    with pytest.raises(ValueError, match="not a PEM CA file"):
        BackendConfig(url="https://10.0.0.5:443", tls_ca_file=str(not_pem))
    with pytest.raises(ValueError, match="not a PEM CA file"):
        BackendConfig(url="https://10.0.0.5:443", tls_ca_file=str(tmp_path / "missing.pem"))
