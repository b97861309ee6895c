"""deploy/k8s rendered as `kubectl apply -k` would, every object validated against the
Kubernetes schemas offline, and the fleet's promises checked on what the cluster would get.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from backends.tgi.backend import TGIBackend
from gateway.config.settings import ConfigError, Settings
from gateway.config.source import load_settings
from gateway.policy.auth import new_key
from tests.support.servers import ROOT

K8S = ROOT / "deploy" / "k8s"
TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.5"
# 1.30: the first release with the preStop `sleep` action on by default; and the newest bundled.
SCHEMA_VERSIONS = ("1.30", kubernetes_validate.latest_version())
GATEWAY_LABELS = {"app.kubernetes.io/name": "chatgate", "app.kubernetes.io/component": "gateway"}
Objects = list[dict[str, Any]]


@functools.cache
def kubectl() -> str:
    """kubectl with kustomize v5 (labels, components), or a one-line failure saying what to get."""
    found = shutil.which(os.environ.get("KUBECTL", "kubectl"))
    needs = "deploy/k8s needs kubectl >= 1.27, for kustomize v5 (see deploy/k8s/README.md, Tests)"
    if found is None:
        pytest.fail(f"{needs}: no kubectl found", pytrace=False)
    answer = subprocess.run([found, "version", "--client", "-o", "json"], capture_output=True, text=True)
    kustomize = json.loads(answer.stdout or "{}").get("kustomizeVersion", "older than v4")
    if not re.match(r"v([5-9]|\d\d)\.", kustomize):
        pytest.fail(f"{needs}: {found} has kustomize {kustomize}", pytrace=False)
    return found


def render(directory: Path) -> Objects:
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


@pytest.fixture(scope="module", params=["base", "overlays/tgi"])
def objects(request) -> Objects:
    return render(K8S / request.param)


@pytest.fixture(scope="module")
def tgi_objects() -> Objects:
    return render(K8S / "overlays" / "tgi")


@pytest.fixture(scope="module")
def with_servicemonitor(tmp_path_factory) -> Objects:
    """The TGI overlay with the ServiceMonitor component, as a user's kustomization adds it."""
    folder = tmp_path_factory.mktemp("servicemonitor")
    relative = Path(os.path.relpath(K8S, folder))  # kustomize refuses absolute paths
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [str(relative / "overlays" / "tgi")],
                "components": [str(relative / "components" / "servicemonitor")],
            }
        )
    )
    return render(folder)


def find(objects: Objects, kind: str, name: str) -> dict[str, Any]:
    """The object of that kind whose name is `name` (generated ones carry a hash suffix)."""
    matches = [
        o
        for o in objects
        if o["kind"] == kind and re.fullmatch(rf"{name}(-[a-z0-9]{{10}})?", o["metadata"]["name"])
    ]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    [only] = deployment["spec"]["template"]["spec"]["containers"]
    return only


def secret_environment(objects: Objects) -> dict[str, str]:
    data = find(objects, "Secret", "chatgate-secrets")["data"]
    return {name: base64.b64decode(value).decode() for name, value in data.items()}


def gateway_settings(objects: Objects, tmp_path: Path, monkeypatch, **environment: str) -> Settings:
    """The ConfigMap's chatgate.yaml through the gateway's own loader, with the Secret as the
    pod's environment (envFrom), as `chatgate serve --config` reads it in the pod."""
    for name, value in {**secret_environment(objects), **environment}.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "chatgate.yaml"
    path.write_text(find(objects, "ConfigMap", "chatgate-config")["data"]["chatgate.yaml"])
    return load_settings(path)


def a_real_key() -> dict[str, str]:
    """What `chatgate keys new team-a` gives the operator to put in secrets.env."""
    return {"TEAM_A_KEY_SHA256": new_key()[1]}


def test_every_object_is_valid_for_kubernetes(objects):
    for version in SCHEMA_VERSIONS:
        for item in objects:
            kubernetes_validate.validate(item, version, strict=True)


def test_the_servicemonitor_component_scrapes_the_gateway_pods(with_servicemonitor):
    """The ServiceMonitor is a CRD, outside the Kubernetes schemas: its references are checked here."""
    monitor = find(with_servicemonitor, "ServiceMonitor", "chatgate")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = find(with_servicemonitor, "Service", "chatgate")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    for item in with_servicemonitor:
        if item is not monitor:
            kubernetes_validate.validate(item, SCHEMA_VERSIONS[-1], strict=True)


def test_the_gateway_runs_replicas_with_probes_and_resources(objects):
    deployment = find(objects, "Deployment", "chatgate")
    assert deployment["spec"]["replicas"] >= 2
    gateway = container(deployment)
    assert gateway["args"][:2] == ["chatgate", "serve"]
    assert gateway["image"].startswith("chatgate:")  # the image of deploy/Dockerfile
    [port] = gateway["ports"]
    assert port["containerPort"] == 8080 == int(gateway["args"][gateway["args"].index("--port") + 1])
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port["name"]}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= gateway["resources"][kind].keys(), kind


def test_the_gateway_runs_unprivileged_on_a_read_only_root(objects):
    pod = find(objects, "Deployment", "chatgate")["spec"]["template"]["spec"]
    gateway = container(find(objects, "Deployment", "chatgate"))
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user
    context = gateway["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    tmp = next(m for m in gateway["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])


def test_a_terminating_pod_drains_within_its_grace_period(objects, tmp_path, monkeypatch):
    pod = find(objects, "Deployment", "chatgate")["spec"]["template"]["spec"]
    pre_stop = container(find(objects, "Deployment", "chatgate"))["lifecycle"]["preStop"]
    assert pre_stop["sleep"]["seconds"] >= 3  # endpoints drop the pod before SIGTERM
    shutdown = gateway_settings(objects, tmp_path, monkeypatch, **a_real_key()).server.shutdown
    needed = pre_stop["sleep"]["seconds"] + shutdown.drain + shutdown.deadline
    assert pod["terminationGracePeriodSeconds"] > needed


def test_the_config_map_is_a_gateway_config_fed_by_the_secret(objects, tmp_path, monkeypatch):
    deployment = find(objects, "Deployment", "chatgate")
    gateway, pod = container(deployment), deployment["spec"]["template"]["spec"]
    config_map = find(objects, "ConfigMap", "chatgate-config")
    secret = find(objects, "Secret", "chatgate-secrets")
    [volume] = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == volume["name"])
    assert gateway["args"][gateway["args"].index("--config") + 1] == f"{mount['mountPath']}/chatgate.yaml"
    assert {"secretRef": {"name": secret["metadata"]["name"]}} in gateway["envFrom"]
    settings = gateway_settings(objects, tmp_path, monkeypatch, **a_real_key())
    assert settings.keys and settings.server.port == 8080 and settings.server.host == "0.0.0.0"


def test_the_shipped_placeholder_key_keeps_the_gateway_from_starting(objects, tmp_path, monkeypatch):
    """Until secrets.env holds a real key's sha256 the fleet does not run open."""
    with pytest.raises(ConfigError, match=r"keys\.0\.sha256"):
        gateway_settings(objects, tmp_path, monkeypatch)


def test_service_autoscaler_and_disruption_budget_select_the_gateway(objects):
    deployment = find(objects, "Deployment", "chatgate")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert GATEWAY_LABELS.items() <= pod_labels.items()
    service = find(objects, "Service", "chatgate")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http"}
    autoscaler = find(objects, "HorizontalPodAutoscaler", "chatgate")
    assert autoscaler["apiVersion"] == "autoscaling/v2"
    assert autoscaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "chatgate",
    }
    assert autoscaler["spec"]["minReplicas"] >= 2
    budget = find(objects, "PodDisruptionBudget", "chatgate")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_prometheus_scrapes_every_gateway_pod(objects):
    deployment = find(objects, "Deployment", "chatgate")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    [port] = container(deployment)["ports"]
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]


def test_the_replicas_share_limits_in_the_redis_service(objects, tmp_path, monkeypatch):
    settings = gateway_settings(objects, tmp_path, monkeypatch, **a_real_key())
    assert settings.rate_limits.store == "redis"
    url = urlsplit(settings.rate_limits.redis.url)
    service = find(objects, "Service", url.hostname)
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    redis = find(objects, "StatefulSet", url.hostname)
    assert service["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    policy = find(objects, "NetworkPolicy", "redis")
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": GATEWAY_LABELS}}]


def option(args: list[str], name: str) -> str | None:
    """The value after `--name` in redis-server's arguments (the last one given wins)."""
    values = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == f"--{name}"]
    return values[-1] if values else None


def test_redis_keeps_the_budgets_on_a_persistent_volume(objects):
    """Regression (issue 28, item 6): Redis ran with `--save "" --appendonly no` on an emptyDir,
    so a restart reset every monthly budget. It now writes its append-only file, fsynced every
    second, into the directory a PersistentVolumeClaim of its StatefulSet backs, and evicts
    nothing."""
    redis = find(objects, "StatefulSet", "redis")
    server = container(redis)
    args = server["args"]
    assert args[0] == "redis-server"
    assert option(args, "appendonly") == "yes" and option(args, "appendfsync") in {"everysec", "always"}
    assert option(args, "maxmemory-policy") == "noeviction"
    mounted = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    claims = {c["metadata"]["name"]: c for c in redis["spec"]["volumeClaimTemplates"]}
    data = [name for name, path in mounted.items() if path == option(args, "dir")]
    assert data and data[0] in claims, (mounted, option(args, "dir"))
    assert claims[data[0]]["spec"]["resources"]["requests"]["storage"]
    assert not redis["spec"]["template"]["spec"].get("volumes")  # no emptyDir in its place
    assert redis["spec"]["serviceName"] == "redis" and redis["spec"]["replicas"] == 1
    assert redis["spec"]["template"]["spec"]["securityContext"]["fsGroup"]  # the volume is writable


def test_tgi_runs_the_pinned_image_on_a_gpu_with_a_model_cache(tgi_objects):
    deployment = find(tgi_objects, "Deployment", "tgi")
    tgi = container(deployment)
    assert tgi["image"] == TGI_IMAGE
    compose = yaml.safe_load((ROOT / "deploy" / "compose.tgi.yaml").read_text(encoding="utf-8"))
    assert compose["services"]["tgi"]["image"] == TGI_IMAGE  # one pin for both stacks
    assert int(tgi["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    cache = next(m for m in tgi["volumeMounts"] if m["mountPath"] == "/data")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    claim = volumes[cache["name"]]["persistentVolumeClaim"]["claimName"]
    assert find(tgi_objects, "PersistentVolumeClaim", claim)
    service = find(tgi_objects, "Service", "tgi")
    [port] = service["spec"]["ports"]
    assert port["port"] == 80
    assert {"name": port["targetPort"], "containerPort": 80} in tgi["ports"]


def test_the_tgi_overlay_points_the_gateway_at_the_tgi_service(tgi_objects, tmp_path, monkeypatch):
    settings = gateway_settings(tgi_objects, tmp_path, monkeypatch, **a_real_key())
    [deployment] = settings.deployments
    assert deployment.backend == "tgi"
    url = urlsplit(deployment.options["url"])
    assert (url.hostname, url.port) == ("tgi", 80)
    backend = TGIBackend(model=deployment.served_model, **deployment.options)  # the options validate
    environment = {
        e["name"]: e.get("value") for e in container(find(tgi_objects, "Deployment", "tgi"))["env"]
    }
    assert backend.options.context_length == int(environment["MAX_TOTAL_TOKENS"])
    assert backend.options.max_stop_sequences == int(environment["MAX_STOP_SEQUENCES"])
    assert backend.options.max_top_n_tokens == int(environment["MAX_TOP_N_TOKENS"])
    policy = find(tgi_objects, "NetworkPolicy", "tgi")  # clients cannot go around the gateway
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": GATEWAY_LABELS}}]


def test_the_readme_gives_the_commands():
    readme = (K8S / "README.md").read_text(encoding="utf-8")
    for command in ("kubectl apply -k deploy/k8s/base", "kubectl apply -k deploy/k8s/overlays/tgi"):
        assert command in readme
