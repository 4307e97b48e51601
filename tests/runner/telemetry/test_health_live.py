"""GET /health/live: the liveness probe answers whenever the process does (deploy/k8s)."""

from __future__ import annotations

import time

import httpx

from tests.support.runner_proc import fixture_bin, start_runner, wait_started

_FAILING_MODEL = "\n".join(
    [
        "models:",
        "  - id: m",
        "    backend: llama-server",
        "    path: /dev/null",
        "    preload: true",
        "    vram_mb: 64",
        f"    bin: {fixture_bin('llama-server-exits-at-start')}",
    ]
)


def test_health_live_answers_while_health_is_unhealthy() -> None:
    """Every model failed: /health (readiness) is 503, /health/live (liveness) stays 200."""
    with start_runner(models_file=_FAILING_MODEL + "\n", wait_ready=False) as runner:
        wait_started(runner)
        deadline = time.monotonic() + 30
        ready = httpx.get(runner.url + "/health", timeout=5)
        while ready.json()["status"] != "unhealthy" and time.monotonic() < deadline:
            time.sleep(0.05)
            ready = httpx.get(runner.url + "/health", timeout=5)
        live = httpx.get(runner.url + "/health/live", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "unhealthy"
    assert live.status_code == 200 and live.json() == {"status": "alive"}
