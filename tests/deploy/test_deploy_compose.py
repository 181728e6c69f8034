"""deploy/compose*.yaml and the files they mount, the Dockerfile and .dockerignore.

The compose files are validated against the Compose Specification JSON schema as vendored (with its
Apache-2.0 licence) by the `check-jsonschema` package (``builtin_schemas/vendor/compose-spec.json``).
"""

from __future__ import annotations

import contextlib
import copy
import http.server
import importlib.resources
import inspect
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from backends.sim.cli import sim_backend
from gateway.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose_validator() -> Draft202012Validator:
    schema_file = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    assert schema["title"] == "Compose Specification"
    return Draft202012Validator(schema)


@pytest.mark.parametrize("name", ["compose.yaml", "compose.sglang.yaml"])
def test_compose_matches_specification(name: str, compose_validator: Draft202012Validator) -> None:
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in compose_validator.iter_errors(load(DEPLOY / name))]
    assert errors == []


def test_validator_rejects_a_broken_compose_file(compose_validator: Draft202012Validator) -> None:
    doc = copy.deepcopy(load(DEPLOY / "compose.yaml"))
    doc["services"]["redis"]["healthcheck"] = "yes"  # must be a mapping
    doc["services"]["grafana"]["imagee"] = "typo"
    assert len(list(compose_validator.iter_errors(doc))) >= 2


def test_compose_services() -> None:
    doc = load(DEPLOY / "compose.yaml")
    services = doc["services"]
    assert {"cachegate-1", "cachegate-2", "redis", "otel-collector", "tempo", "prometheus", "grafana"} <= set(services)
    sims = {name: s for name, s in services.items() if "sim-backend" in (s.get("command") or [])}
    assert 2 <= len(sims) <= 3
    # The sim command uses only options `cachegate sim-backend` has.
    options = {"--" + p.replace("_", "-") for p in inspect.signature(sim_backend).parameters}
    for s in sims.values():
        assert {a for a in s["command"] if a.startswith("--")} <= options
    for name in ("cachegate-1", "cachegate-2"):
        env = services[name]["environment"]
        assert env["CACHEGATE_REDIS_URL"].startswith("redis://redis:")  # the two replicas share Redis
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
        assert "/etc/cachegate/config.yaml" in services[name]["volumes"][0]
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]


def _host_mounts(doc: dict[str, Any]) -> Iterator[str]:
    for service in doc["services"].values():
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                yield source


@pytest.mark.parametrize("name", ["compose.yaml", "compose.sglang.yaml"])
def test_mounted_files_exist(name: str) -> None:
    mounts = list(_host_mounts(load(DEPLOY / name)))
    assert mounts
    missing = [m for m in mounts if not (DEPLOY / m).exists()]
    assert missing == []


def test_override_swaps_in_real_sglang() -> None:
    base, override = load(DEPLOY / "compose.yaml"), load(DEPLOY / "compose.sglang.yaml")
    sglang = override["services"]["sglang"]
    assert sglang["image"].startswith("lmsysorg/sglang:")
    assert sglang["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    script = sglang["entrypoint"][-1].rsplit("/", 1)[-1]
    assert (DEPLOY / "sglang" / re.sub(r"\$\{SGLANG_SCRIPT:-(.*)\}", r"\1", script)).exists()
    # Every simulated backend is disabled by a profile in the override.
    sims = [n for n, s in base["services"].items() if "sim-backend" in (s.get("command") or [])]
    assert all(override["services"][n].get("profiles") for n in sims)


@pytest.mark.parametrize(
    ("config", "compose", "prom"),
    [
        ("cachegate.compose.yaml", "compose.yaml", "prometheus/prometheus.yml"),
        ("cachegate.sglang.yaml", "compose.sglang.yaml", "prometheus/prometheus.sglang.yml"),
    ],
)
def test_gateway_config_and_scrape_targets_agree(config: str, compose: str, prom: str) -> None:
    cfg = Config.model_validate(load(DEPLOY / config))
    services = set(load(DEPLOY / "compose.yaml")["services"]) | set(load(DEPLOY / compose)["services"])
    backends = {b.url.split("//", 1)[1] for m in cfg.models.values() for b in m.backends}
    assert backends and {b.split(":")[0] for b in backends} <= services
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in load(DEPLOY / prom)["scrape_configs"]}
    assert set(jobs["sglang"]) == backends
    assert set(jobs["cachegate"]) == {"cachegate-1:8080", "cachegate-2:8080"}
    assert {t.split(":")[0] for ts in jobs.values() for t in ts} <= services


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus.sglang.yml"])
def test_promtool_accepts_config(name: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package (.ci/run installs it)"
    out = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus" / name)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_collector_and_tempo_wiring() -> None:
    otel = load(DEPLOY / "otel-collector.yaml")
    pipeline = otel["service"]["pipelines"]["traces"]
    assert set(pipeline["receivers"]) <= set(otel["receivers"])
    assert set(pipeline["processors"]) <= set(otel["processors"])
    assert set(pipeline["exporters"]) <= set(otel["exporters"])
    protocols = otel["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["endpoint"].endswith(":4318") and protocols["grpc"]["endpoint"].endswith(":4317")
    tempo = load(DEPLOY / "tempo.yaml")
    grpc = tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert otel["exporters"]["otlp/tempo"]["endpoint"] == "tempo:" + grpc.rsplit(":", 1)[1]


def test_grafana_datasources_link_exemplars_to_tempo() -> None:
    sources = {d["uid"]: d for d in load(DEPLOY / "grafana/provisioning/datasources/datasources.yaml")["datasources"]}
    assert sources["prometheus"]["type"] == "prometheus" and sources["tempo"]["type"] == "tempo"
    links = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert links == [{"name": "trace_id", "datasourceUid": "tempo"}]
    provider = load(DEPLOY / "grafana/provisioning/dashboards/dashboards.yaml")["providers"][0]
    grafana = load(DEPLOY / "compose.yaml")["services"]["grafana"]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]


# --- Dockerfile ---------------------------------------------------------------------------------


def dockerfile() -> list[str]:
    """Instructions with continuation lines joined."""
    return [
        line.strip()
        for line in (ROOT / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_dockerfile_shape() -> None:
    lines = dockerfile()
    assert lines[0] == "FROM python:3.11-slim"
    assert any(re.fullmatch(r"RUN pip install \.( .*)?", line) for line in lines)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert json.loads(next(line for line in lines if line.startswith("ENTRYPOINT "))[11:]) == ["cachegate"]
    assert json.loads(next(line for line in lines if line.startswith("CMD "))[4:]) == [
        "serve",
        "--config",
        "/etc/cachegate/config.yaml",
    ]
    # What COPY brings in is not excluded by .dockerignore, and covers the packages pyproject installs but
    # the load-test tools: the image carries the service (and the simulated SGLang compose runs), not them.
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    copied = {part for line in lines if line.startswith("COPY ") for part in line.split()[1:-1]}
    assert not copied & ignored
    packages = load_pyproject_packages()
    assert packages - {"loadtest"} <= copied
    assert "loadtest" not in copied


def load_pyproject_packages() -> set[str]:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {p.rstrip("*") for p in data["tool"]["setuptools"]["packages"]["find"]["include"]}


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def health_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_dockerfile_healthcheck_probes_healthz() -> None:
    line = next(line for line in dockerfile() if line.startswith("HEALTHCHECK "))
    cmd = json.loads(line[line.index("CMD ") + 4 :])
    cmd[0] = shutil.which("python3") or "python3"
    with health_server() as port:
        ok = subprocess.run(cmd, env={"CACHEGATE_PORT": str(port)}, capture_output=True, timeout=10)
        assert ok.returncode == 0, ok.stderr
    down = subprocess.run(cmd, env={"CACHEGATE_PORT": str(port)}, capture_output=True, timeout=10)
    assert down.returncode != 0
