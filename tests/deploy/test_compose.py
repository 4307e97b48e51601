"""compose.yaml, read by a real Compose Specification parser (PyPI compose-spec, the Rust
compose_spec crate; no Docker engine runs here), with its Prometheus config checked by
promtool and its Grafana provisioning pointing at what it mounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose

from runner.floor.settings import Settings, load_settings
from tests.deploy.tools import ROOT, promtool


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return doc


def _runners(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n.startswith("runner")}


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        mounts[container] = ROOT / host
    return mounts


def test_compose_parses_as_the_compose_specification(compose: dict[str, Any]) -> None:
    """The file is valid Compose (YAML anchors and merge keys expanded first, as Compose
    does: the parser itself reads YAML 1.2 without merge keys)."""
    parsed = PyCompose.from_yaml(yaml.safe_dump(compose))
    assert set(parsed.service_names()) == {"redis", "runner-1", "runner-2", "prometheus", "grafana"}


def test_compose_parser_rejects_a_misspelt_key(compose: dict[str, Any]) -> None:
    """A misspelt service key is refused (the parse above is not vacuous)."""
    broken = yaml.safe_dump(compose).replace("stop_grace_period", "stop_grace_perod")
    with pytest.raises(ValueError, match="stop_grace_perod"):
        PyCompose.from_yaml(broken)


def test_compose_runners_serve_the_images_default_models(compose: dict[str, Any]) -> None:
    """Two runners built from the Dockerfile on its embedded models.yaml: no models file or
    engine URL from the host (the only mount is the tenants file, read-only), distinct
    runner ids, known settings only, one Redis."""
    runners = _runners(compose)
    assert len(runners) == 2
    known = {name.upper() for name in Settings.model_fields}
    ids = set()
    for service in runners.values():
        assert service["build"]["context"] == "." and service["build"]["dockerfile"] == "Dockerfile"
        env = service["environment"]
        assert set(env) <= known, set(env) - known
        assert "MODELS_CONFIG" not in env
        assert _mounts(service) == {
            "/etc/quorum/tenants.yaml": ROOT / "deploy/compose/tenants.yaml"
        }
        assert service["volumes"][0].endswith(":ro")
        assert env["REDIS_URL"].startswith("redis://redis:")
        ids.add(env["RUNNER_ID"])
    assert len(ids) == 2


def test_compose_prometheus_config_passes_promtool(compose: dict[str, Any]) -> None:
    """The mounted Prometheus config passes `promtool check config` and scrapes each runner
    on its METRICS_PORT, at /metrics and at the picker's path (vLLM's own series)."""
    config = _mounts(compose["services"]["prometheus"])["/etc/prometheus/prometheus.yml"]
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    scrape = yaml.safe_load(config.read_text())["scrape_configs"]
    want = {f"{name}:{s['environment']['METRICS_PORT']}" for name, s in _runners(compose).items()}
    picker = Settings.model_fields["picker_metrics_path"].default
    assert sorted(job["metrics_path"] for job in scrape) == sorted(["/metrics", picker])
    for job in scrape:
        assert {t for sc in job["static_configs"] for t in sc["targets"]} == want, job["job_name"]


def test_compose_grafana_provisions_prometheus_and_the_dashboard(compose: dict[str, Any]) -> None:
    """Grafana's provisioning names the compose Prometheus and a dashboard folder that holds
    deploy/grafana/dashboards/quorum.json."""
    mounts = _mounts(compose["services"]["grafana"])
    provisioning = mounts["/etc/grafana/provisioning"]
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "prometheus" in compose["services"]
    providers = yaml.safe_load((provisioning / "dashboards" / "quorum.yaml").read_text())
    (provider,) = providers["providers"]
    folder = mounts[provider["options"]["path"]]
    assert (folder / "quorum.json").is_file()


def _merged(base: Any, override: Any) -> Any:
    """`docker compose -f base -f override`: mappings merge key by key, anything else
    (a command, a list of ports) is replaced by the override's."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    merged = dict(base)
    for key, value in override.items():
        merged[key] = _merged(base[key], value) if key in base else value
    return merged


def test_compose_sentinel_override_is_valid_and_names_its_sentinels(
    compose: dict[str, Any],
) -> None:
    """compose.yaml with deploy/compose/sentinel.yaml over it is valid Compose; it adds a
    replica of `redis` and three sentinels watching it, and the runners' settings (as the
    runner reads them) find the primary through exactly those sentinels and wait for one
    replica on every spend."""
    override = yaml.safe_load((ROOT / "deploy/compose/sentinel.yaml").read_text())
    merged = _merged(compose, override)
    parsed = PyCompose.from_yaml(yaml.safe_dump(merged))
    sentinels = {n for n in parsed.service_names() if n.startswith("sentinel-")}
    assert len(sentinels) == 3 and "redis-replica" in parsed.service_names()
    replica = merged["services"]["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 :] == ["redis", "6379"]
    for service in merged["services"].values():
        script = " ".join(service.get("entrypoint", []))
        if "--sentinel" in script:
            assert "sentinel monitor quorum redis 6379 2" in script
    for name, runner in _runners(merged).items():
        env = {k: str(v) for k, v in runner["environment"].items() if not k.startswith("<<")}
        settings = load_settings(env)
        assert settings.redis_mode == "sentinel" and settings.nonce_replicas == 1, name
        named = {s.split(":")[0] for s in env["REDIS_SENTINELS"].split(",")}
        assert named == sentinels
        assert set(runner["depends_on"]) >= sentinels
