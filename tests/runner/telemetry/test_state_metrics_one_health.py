"""One health: `/health` (readiness), capabilities' `health` and `/metrics`' `quorum_health`
read the same `Runtime.health()` (runner/telemetry/state_metrics.py)."""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from runner.telemetry.state_metrics import HealthCollector
from tests.support.runner_proc import fixture_bin, start_runner, wait_started

_ALL_FAIL = "\n".join(
    [
        "models:",
        *(
            line
            for model in ("a", "b")
            for line in (
                f"  - id: {model}",
                "    backend: llama-server",
                "    path: /dev/null",
                "    preload: true",
                "    vram_mb: 64",
                f"    bin: {fixture_bin('llama-server-exits-at-start')}",
            )
        ),
    ]
)


def _health_series(text: str) -> dict[str, float]:
    series = {}
    for line in text.splitlines():
        if line.startswith("quorum_health{"):
            labels, value = line.rsplit(" ", 1)
            series[labels.split('status="', 1)[1].split('"', 1)[0]] = float(value)
    return series


@pytest.mark.timeout(60)
def test_one_health_every_model_failed_all_answers_agree() -> None:
    """Every model failed: /health 503 `unhealthy`, capabilities' `health` `unhealthy`
    and `quorum_health{status="unhealthy"}` 1 (every other status 0)."""
    with start_runner(models_file=_ALL_FAIL + "\n", wait_ready=False) as runner:
        wait_started(runner)
        deadline = time.monotonic() + 30
        while True:
            health = httpx.get(runner.url + "/health", timeout=5)
            caps = httpx.get(runner.url + "/v1/capabilities", timeout=5)
            metrics = httpx.get(runner.url + "/metrics", timeout=5)
            if health.json()["status"] == "unhealthy" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert health.status_code == 503 and health.json()["status"] == "unhealthy"
    assert caps.json()["health"] == "unhealthy"
    assert {f["id"] for f in caps.json()["models"]["failed"]} == {"a", "b"}
    series = _health_series(metrics.text)
    assert series["unhealthy"] == 1.0
    assert sum(series.values()) == 1.0


def test_health_collector_exports_every_status_and_an_unlisted_one() -> None:
    """The state set has a series per known status, and the current one even when it is
    not among them; exactly one reads 1."""
    registry = CollectorRegistry()
    current = ["healthy"]
    registry.register(HealthCollector(lambda: current[0]))
    series = _health_series(generate_latest(registry).decode())
    assert series["healthy"] == 1.0 and series["starting"] == 0.0
    current[0] = "degraded"
    series = _health_series(generate_latest(registry).decode())
    assert series["degraded"] == 1.0 and sum(series.values()) == 1.0


def test_health_collector_retries_a_read_that_met_a_resized_dict() -> None:
    """A read that fails with RuntimeError (the METRICS_PORT thread meeting a table
    changing under it) is tried again."""
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("dictionary changed size during iteration")
        return "saturated"

    registry = CollectorRegistry()
    registry.register(HealthCollector(flaky))
    assert _health_series(generate_latest(registry).decode())["saturated"] == 1.0
