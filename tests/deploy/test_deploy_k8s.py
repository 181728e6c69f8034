"""deploy/k8s/: every manifest validates offline against the Kubernetes OpenAPI schemas shipped by
`kubernetes-validate` (strict: unknown fields fail), and the pieces fit together."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.config.schema import Config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
# 1.30 is the oldest release with the preStop `sleep` action; the newest is what the package bundles.
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def documents() -> list[dict[str, Any]]:
    docs = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    return next(d for d in documents() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name))


def test_kustomization_lists_every_manifest() -> None:
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization()["resources"]) == files
    assert "namespace" not in kustomization()
    assert all("namespace" not in d["metadata"] for d in documents())


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_validate(version: str) -> None:
    kinds = []
    for doc in documents():
        kubernetes_validate.validate(doc, version, strict=True)
        kinds.append(f"{doc['apiVersion']}/{doc['kind']}")
    assert sorted(kinds) == sorted(
        [
            "v1/ConfigMap",
            "v1/Secret",
            "apps/v1/Deployment",
            "v1/Service",
            "apps/v1/Deployment",
            "v1/Service",
            "autoscaling/v2/HorizontalPodAutoscaler",
            "policy/v1/PodDisruptionBudget",
        ]
    )


def test_validator_rejects_unknown_and_mistyped_fields() -> None:
    bad = copy.deepcopy(by_kind("Deployment", "cachegate"))
    bad["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["pathh"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)
    bad = copy.deepcopy(by_kind("HorizontalPodAutoscaler"))
    bad["spec"]["minReplicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[-1], strict=True)


def test_gateway_deployment() -> None:
    dep = by_kind("Deployment", "cachegate")
    assert dep["spec"]["replicas"] >= 2
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"]) | set(container["resources"]["limits"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["args"] == ["serve", "--config", "/etc/cachegate/config.yaml"]
    # Env from the Secret names keys the Secret has.
    secret = by_kind("Secret")
    refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs and all(r["name"] == secret["metadata"]["name"] and r["key"] in secret["stringData"] for r in refs)
    # Service, PDB and the pod template agree on labels; the HPA scales this Deployment.
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert by_kind("Service", "cachegate")["spec"]["selector"].items() <= labels.items()
    assert by_kind("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = by_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "cachegate" and hpa["spec"]["minReplicas"] >= 2
    redis = by_kind("Deployment", "cachegate-redis")["spec"]["template"]["metadata"]["labels"]
    assert by_kind("Service", "cachegate-redis")["spec"]["selector"].items() <= redis.items()


def test_init_container_assembles_a_valid_config(tmp_path: Path) -> None:
    """Run the init container's own command on the ConfigMap and Secret contents."""
    dep = by_kind("Deployment", "cachegate")
    init = dep["spec"]["template"]["spec"]["initContainers"][0]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    files = {
        mounts["config"] + "/config.yaml": by_kind("ConfigMap")["data"]["config.yaml"],
        mounts["secret"] + "/keys.yaml": by_kind("Secret")["stringData"]["keys.yaml"],
    }
    script = init["command"][-1]
    for path, text in files.items():
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_text(text)
        script = script.replace(path, str(tmp_path / path.lstrip("/")))
    out = mounts["assembled"] + "/config.yaml"
    (tmp_path / mounts["assembled"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    script = script.replace(out, str(tmp_path / out.lstrip("/")))
    subprocess.run([*init["command"][:-1], script], check=True, timeout=10)
    cfg = Config.model_validate(yaml.safe_load((tmp_path / out.lstrip("/")).read_text()))
    assert [k.team for k in cfg.keys] == ["platform"]
    assert cfg.redis_url is not None and "cachegate-redis" in cfg.redis_url
    assert cfg.listen.host == "0.0.0.0"
    assert all(b.dp_size == 8 for m in cfg.models.values() for b in m.backends)
