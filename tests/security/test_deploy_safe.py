"""What ships in deploy/ and compose.yaml (issue 25, Why 2 and 3): a deployment copied as it
is must not trust asserted tenant ids, serve tenant-labelled metrics on the public port, or
run a Redis that evicts nonces or fills up without bound."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.deploy.tools import K8S, ROOT, kustomize

pytestmark = pytest.mark.timeout(120)

OVERLAYS = {"base": K8S / "base", "gpu": K8S / "overlays" / "gpu"}


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def _compose_runners() -> list[dict[str, str]]:
    services = _compose()["services"]
    return [dict(s["environment"]) for n, s in services.items() if n.startswith("runner")]


def _k8s_runner_env(overlay: str) -> dict[str, Any]:
    objs = kustomize(OVERLAYS[overlay])
    deploy = next(
        o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "quorum-runner"
    )
    container = next(
        c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "runner"
    )
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _redis_args(args: list[str]) -> dict[str, str]:
    flags = {}
    for i, arg in enumerate(args):
        if arg.startswith("--") and i + 1 < len(args):
            flags[arg[2:]] = args[i + 1]
    return flags


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_kubernetes_runners_take_identity_from_the_gateway_only(overlay: str) -> None:
    """Attack: the shipped manifests configured no keys, so `X-Tenant-ID` was trusted behind
    the gateway. They run in gateway mode, hearing only the gateway (its shared secret)."""
    env = _k8s_runner_env(overlay)
    assert env.get("TENANT_IDENTITY") == "gateway", env
    assert "GATEWAY_SECRET" in env or "GATEWAY_PEERS" in env, env


def test_compose_runners_require_api_keys() -> None:
    """Attack: compose shipped in open mode (any X-Tenant-ID believed). Its runners run in
    keys mode with a tenants file."""
    for env in _compose_runners():
        assert env.get("TENANT_IDENTITY") == "keys" and env.get("TENANTS_FILE"), env


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_shipped_metrics_with_tenant_ids_stay_off_the_public_port(overlay: str) -> None:
    """Attack: `/metrics` on the inference port lists every tenant. Deployments serve it on
    METRICS_PORT only."""
    for env in [_k8s_runner_env(overlay), *_compose_runners()]:
        assert env.get("METRICS_ON_API_PORT") == "false" and env.get("METRICS_PORT"), env


def test_shipped_redis_has_a_memory_bound_that_never_evicts_nonces() -> None:
    """Attack: the shipped Redis had no `maxmemory`: a tenant filling it failed the nonce
    store and the limiter. Both deployments bound it and evict nothing (`noeviction`):
    nonces and limiter windows are never dropped to make room."""
    compose_args = _compose()["services"]["redis"]["command"]
    redis = yaml.safe_load((K8S / "base" / "redis.yaml").read_text().split("\n---\n")[0])
    k8s_args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    for args in (compose_args, k8s_args):
        flags = _redis_args(args)
        assert flags.get("maxmemory-policy") == "noeviction", args
        assert flags.get("maxmemory", "0") not in ("0", ""), args


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_kubernetes_metrics_port_is_open_to_the_monitoring_namespace_only(overlay: str) -> None:
    """Attack: the shipped NetworkPolicy opened the metrics port (tenant ids, a thread per
    connection) to every pod of the cluster. It admits the monitoring namespace only."""
    objs = kustomize(OVERLAYS[overlay])
    policy = next(
        o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "quorum-runner"
    )
    env = _k8s_runner_env(overlay)
    metrics = [
        rule
        for rule in policy["spec"]["ingress"]
        if any(p["port"] == int(env["METRICS_PORT"]) for p in rule["ports"])
    ]
    assert len(metrics) == 1 and metrics[0].get("from"), metrics
    selectors = [peer["namespaceSelector"]["matchLabels"] for peer in metrics[0]["from"]]
    assert selectors == [{"kubernetes.io/metadata.name": "monitoring"}]
