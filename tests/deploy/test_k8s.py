"""deploy/k8s, rendered by kustomize and checked by real validators: Kubernetes' own schemas
for core objects, the Prometheus Operator's types for the PodMonitor, the pinned Gateway API
Inference Extension / llm-d-router types for the pool, objectives and picker config; then what
ties them to the runner (probes, ports, labels, settings)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.llama_server.protocol import LaunchOptions, command_line
from runner.floor.settings import Settings, load_settings
from tests.deploy.tools import (
    K8S,
    crd_validator,
    errors,
    has_kubernetes_schema,
    kustomize,
    node,
    typecheck,
    validate_kubernetes,
)

OVERLAYS = {
    "base": K8S / "base",
    "gpu": K8S / "overlays" / "gpu",
    "sentinel": K8S / "overlays" / "sentinel",
}
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("llm-d.ai/v1alpha2", "InferenceObjective"): "inferenceobjective-v1alpha2.json",
}
PODMONITOR_TYPE = "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor"


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return kustomize(OVERLAYS[request.param])


def _one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _runner(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = _one(objs, "Deployment", "quorum-runner")["spec"]["template"]["spec"]
    container: dict[str, Any] = next(c for c in pod["containers"] if c["name"] == "runner")
    return container


def _epp_config(objs: list[dict[str, Any]]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        _one(objs, "ConfigMap", "quorum-epp-config")["data"]["epp-config.yaml"]
    )
    return config


@pytest.mark.timeout(120)
def test_k8s_core_objects_valid_against_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    """Every core object passes Kubernetes 1.37's own schema, strict; only the three
    custom kinds have none there."""
    custom = set()
    for obj in rendered:
        if has_kubernetes_schema(obj):
            validate_kubernetes(obj)
        else:
            custom.add(obj["kind"])
    assert custom == {"InferencePool", "InferenceObjective", "PodMonitor"}


def test_k8s_gateway_objects_valid_against_pinned_schemas(rendered: list[dict[str, Any]]) -> None:
    """The InferencePool and InferenceObjectives match the pinned GIE v1.6.0 / llm-d-router
    v0.10.0 types (tests/deploy/schemas), metadata by Kubernetes' ObjectMeta schema."""
    checked = 0
    for obj in rendered:
        schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
        if schema is not None:
            assert list(errors(crd_validator(schema), obj)) == [], obj["metadata"]["name"]
            checked += 1
    assert checked == 4


def test_k8s_pinned_schemas_reject_what_the_crds_reject() -> None:
    """The pool schema refuses what its CRD does: an unknown field, a port out of range,
    a Service reference without a port."""
    pool = _one(kustomize(OVERLAYS["base"]), "InferencePool", "quorum")
    validator = crd_validator("inferencepool-v1.json")
    typo = {**pool, "spec": {**pool["spec"], "targetPort": [{"number": 8080}]}}
    far = {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 70000}]}}
    ref = {k: v for k, v in pool["spec"]["endpointPickerRef"].items() if k != "port"}
    portless = {**pool, "spec": {**pool["spec"], "endpointPickerRef": ref}}
    for bad in (typo, far, portless):
        assert list(errors(validator, bad)), bad["spec"]


@pytest.mark.timeout(120)
def test_k8s_podmonitor_valid_against_prometheus_operator_types(tmp_path: Path) -> None:
    """The PodMonitor type-checks against @kubernetes-models/prometheus-operator (no unknown
    field) and passes its schema validator."""
    monitor = _one(kustomize(OVERLAYS["base"]), "PodMonitor", "quorum-runner")
    imports = [f"import type {{ IPodMonitor }} from '{PODMONITOR_TYPE}';"]
    assert typecheck(tmp_path, imports, [("IPodMonitor", monitor)]) == ""
    script = (
        f"import {{ PodMonitor }} from '{PODMONITOR_TYPE}';"
        f"new PodMonitor({json.dumps(monitor)})"
        ".validate(); console.log('valid');"
    )
    assert node(script).strip() == "valid"


def test_k8s_podmonitor_scrapes_both_metrics_paths(rendered: list[dict[str, Any]]) -> None:
    """Prometheus scrapes each runner's METRICS_PORT at /metrics and at the picker's path,
    where vLLM's own series are: the port the runner's METRICS_PORT names."""
    monitor = _one(rendered, "PodMonitor", "quorum-runner")
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    default = Settings.model_fields["picker_metrics_path"].default
    assert sorted(e["path"] for e in endpoints) == sorted(["/metrics", default])
    ports = {p["name"]: p["containerPort"] for p in _runner(rendered)["ports"]}
    env = {e["name"]: e.get("value") for e in _runner(rendered)["env"]}
    assert {ports[e["port"]] for e in endpoints} == {int(env["METRICS_PORT"])}


def test_k8s_podmonitor_typecheck_rejects_unknown_field(tmp_path: Path) -> None:
    """A misspelt PodMonitor field fails the type check (the check is not vacuous)."""
    monitor = _one(kustomize(OVERLAYS["base"]), "PodMonitor", "quorum-runner")
    bad = {**monitor, "spec": {**monitor["spec"], "podMetricsEndpoint": []}}
    imports = [f"import type {{ IPodMonitor }} from '{PODMONITOR_TYPE}';"]
    assert "podMetricsEndpoint" in typecheck(tmp_path, imports, [("IPodMonitor", bad)])


def test_k8s_epp_config_valid_and_reads_vllm_names(rendered: list[dict[str, Any]]) -> None:
    """The picker's config matches EndpointPickerConfig v1alpha1, every profile plugin is
    declared, and metrics are read by the built-in vLLM mapping (no engineConfigs) on the
    runner's PICKER_METRICS_PATH, as the runner pods leave it."""
    config = _epp_config(rendered)
    assert list(errors(crd_validator("endpointpickerconfig-v1alpha1.json"), config)) == []
    declared = {p.get("name") or p["type"] for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= declared
    extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
    assert extractor["parameters"] == {"defaultEngine": "vllm"}
    source = next(p for p in config["plugins"] if p["type"] == "metrics-data-source")
    assert "port" not in source["parameters"]  # the pool's target port: the runner's own
    env = {e["name"]: e.get("value") for e in _runner(rendered)["env"]}
    default = Settings.model_fields["picker_metrics_path"].default
    assert source["parameters"]["path"] == env.get("PICKER_METRICS_PATH", default)


def test_k8s_pool_objectives_and_picker_point_at_each_other(rendered: list[dict[str, Any]]) -> None:
    """The pool selects the runner pods on their http port, names the picker's Service and
    gRPC port; the picker serves that pool; one objective per X-Priority value."""
    pool = _one(rendered, "InferencePool", "quorum")
    deployment = _one(rendered, "Deployment", "quorum-runner")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in _runner(rendered)["ports"]}
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports["http"]]
    ref = pool["spec"]["endpointPickerRef"]
    service = _one(rendered, "Service", ref["name"])
    assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    epp = _one(rendered, "Deployment", "quorum-epp")["spec"]["template"]["spec"]["containers"][0]
    assert f"--pool-name={pool['metadata']['name']}" in epp["args"]
    assert ":v" in epp["image"] and not epp["image"].endswith(":latest")
    objectives = [o for o in rendered if o["kind"] == "InferenceObjective"]
    assert {o["metadata"]["name"] for o in objectives} == {"high", "normal", "low"}
    assert {o["spec"]["poolRef"]["name"] for o in objectives} == {pool["metadata"]["name"]}
    by_name = {o["metadata"]["name"]: o["spec"]["priority"] for o in objectives}
    assert by_name["high"] > by_name["normal"] > by_name["low"]


def test_k8s_runner_probes_map_to_health_states(rendered: list[dict[str, Any]]) -> None:
    """Startup and readiness ask /health (preload done, able to serve); liveness asks
    /health/live, which reads no engine or queue."""
    runner = _runner(rendered)
    assert runner["startupProbe"]["httpGet"]["path"] == "/health"
    assert runner["readinessProbe"]["httpGet"]["path"] == "/health"
    assert runner["livenessProbe"]["httpGet"]["path"] == "/health/live"
    startup = runner["startupProbe"]
    env = {e["name"]: e.get("value") for e in runner["env"]}
    load_timeout = float(
        env.get("ENGINE_LOAD_TIMEOUT_S") or Settings.model_fields["engine_load_timeout_s"].default
    )
    assert startup["periodSeconds"] * startup["failureThreshold"] >= load_timeout


def test_k8s_network_policy_opens_only_runner_and_metrics_ports(
    rendered: list[dict[str, Any]],
) -> None:
    """Ingress to a runner pod: its http and metrics ports only; engines bind 127.0.0.1."""
    policy = _one(rendered, "NetworkPolicy", "quorum-runner")
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    runner = _runner(rendered)
    assert opened == {p["containerPort"] for p in runner["ports"]}
    env = {e["name"]: e.get("value") for e in runner["env"]}
    assert int(env["METRICS_PORT"]) in opened and Settings.model_fields["port"].default in opened
    argv = command_line(LaunchOptions("/bin/llama-server", "/m.gguf", 30000, "k", 1, "/tmp/s"))
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_k8s_runner_environment_names_known_settings(rendered: list[dict[str, Any]]) -> None:
    """Every variable set on the runner is one it reads; replicas share the Redis Service."""
    runner = _runner(rendered)
    known = {name.upper() for name in Settings.model_fields}
    names = {e["name"] for e in runner["env"]}
    assert names <= known, names - known
    services = [o for o in rendered if o["kind"] == "Service"]
    redis = next(o for o in services if o["metadata"]["name"] == "quorum-redis")
    url = next(e["value"] for e in runner["env"] if e["name"] == "REDIS_URL")
    assert url == f"redis://{redis['metadata']['name']}:{redis['spec']['ports'][0]['port']}/0"


def test_k8s_runner_runs_as_the_image_user(rendered: list[dict[str, Any]]) -> None:
    """The pod runs as the Dockerfile's non-root user (uid 10001)."""
    pod = _one(rendered, "Deployment", "quorum-runner")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 10001
    dockerfile = (K8S.parents[1] / "Dockerfile").read_text()
    assert "\nUSER 10001:10001\n" in dockerfile


def test_k8s_sentinel_overlay_runners_name_the_sentinels_it_runs() -> None:
    """The sentinel overlay: three Redis pods, each with a sentinel on 26379 behind a
    headless Service; the runners' REDIS_SENTINELS name exactly those pods' sentinels,
    load as settings (REDIS_MODE=sentinel, NONCE_REPLICAS=1), and may reach them; the
    start scripts parse as shell."""
    objs = kustomize(OVERLAYS["sentinel"])
    redis = _one(objs, "StatefulSet", "quorum-redis")["spec"]
    service = _one(objs, "Service", "quorum-redis-nodes")
    assert redis["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    sentinel = next(c for c in redis["template"]["spec"]["containers"] if c["name"] == "sentinel")
    assert [p["containerPort"] for p in sentinel["ports"]] == [26379]
    env = {e["name"]: e.get("value") for e in _runner(objs)["env"]}
    pods = [f"quorum-redis-{i}.quorum-redis-nodes:26379" for i in range(redis["replicas"])]
    assert env["REDIS_SENTINELS"].split(",") == pods
    settings = load_settings({k: v for k, v in env.items() if v is not None})
    assert settings.redis_mode == "sentinel" and settings.nonce_replicas == 1
    policy = _one(objs, "NetworkPolicy", "quorum-redis")
    opened = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert opened == {6379, 26379}
    scripts = _one(objs, "ConfigMap", "quorum-redis-scripts")["data"]
    for name, text in scripts.items():
        checked = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True)
        assert checked.returncode == 0, (name, checked.stderr)
