"""ops/deploy: every manifest validates offline against the Kubernetes 1.30 schemas
(kubernetes-validate; the Prometheus Operator's PodMonitor is checked by hand), and the manifests
agree with the server: probe paths, a grace period covering preStop + drain, the artifact mounted
read-only, the compile cache on a volume, the HPA on a series /metrics exports, the image the
Dockerfile builds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ninfer.service.metrics import ServiceMetrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "ops" / "deploy"
K8S_VERSION = "1.30"
CRDS = {"PodMonitor"}


def documents() -> list[dict[str, Any]]:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs = []
    for name in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    return docs


def by_kind(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == on_disk


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_validates(doc: dict[str, Any]) -> None:
    if doc["kind"] in CRDS:
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        (endpoint,) = doc["spec"]["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics" and endpoint["port"] == "http"
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_pod_agrees_with_the_server() -> None:
    pod = by_kind("Deployment", "ninfer")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["startupProbe"]["httpGet"]["path"] == "/livez"
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    drain = float(next(a for a in c["args"] if a.startswith("server.drain_timeout_s=")).split("=")[1])
    sleep = float(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain + 10
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    artifact = next(a for a in c["args"] if a.startswith("model.artifact=")).split("=")[1]
    assert artifact.startswith(mounts["models"]["mountPath"]) and mounts["models"]["readOnly"] is True
    cache_env = {e["name"]: e["value"] for e in c["env"]}["NINFER_CACHE_DIR"]
    assert mounts["compile-cache"]["mountPath"] == cache_env  # compile_cache/ lives under it


def test_hpa_scales_on_an_exported_queue_series() -> None:
    hpa = by_kind("HorizontalPodAutoscaler", "ninfer")
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]  # prometheus-adapter turns ':' into '_'
    text = ServiceMetrics(lambda: "m", lambda: None).render().decode()
    exported = {
        line.split("{")[0].split(" ")[0].replace(":", "_") for line in text.splitlines() if line[:1] != "#"
    }
    assert name in exported and "waiting" in name


def test_image_is_the_one_the_dockerfile_builds() -> None:
    docker = (ROOT / "Dockerfile").read_text()
    tag = re.search(r"docker build -t (\S+) \.", docker)
    assert tag is not None
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    images = {i["name"]: i["newName"] for i in kust["images"]}
    used = {
        c["image"]
        for d in documents()
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert {images.get(u, u) for u in used} == {tag.group(1)}
    assert "vllm-router" in docker  # the router Deployment runs from the same image
