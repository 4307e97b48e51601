"""The /health decision (runner/telemetry/health.py)."""

from __future__ import annotations

from runner.telemetry.health import Life, health


def test_health_ready_is_200_with_seed_fields() -> None:
    """A ready runner answers 200 healthy with uptime, models loaded and queue depth."""
    r = health(Life.READY, 12.7, 2, 0, 3, 16)
    assert r.status_code == 200
    assert r.body == {"status": "healthy", "uptime": 12, "modelsLoaded": 2, "queueDepth": 3}


def test_health_starting_and_stopping_are_503() -> None:
    """Starting and shutting down both answer 503 and say which."""
    assert health(Life.STARTING, 0, 0, 0, 0, 16).body["status"] == "starting"
    assert health(Life.STOPPING, 0, 0, 0, 0, 16).status_code == 503


def test_health_all_models_failed_is_503() -> None:
    """When every configured model failed the runner is unhealthy."""
    assert health(Life.READY, 1, 0, 2, 0, 16).status_code == 503
    assert health(Life.READY, 1, 1, 2, 0, 16).status_code == 200


def test_health_saturated_queue_is_503() -> None:
    """A full queue makes /health 503 "saturated" (readiness: route elsewhere for now)."""
    report = health(Life.READY, 1, 1, 0, 16, 16)
    assert report.status_code == 503 and report.body["status"] == "saturated"
    assert health(Life.READY, 1, 1, 0, 15, 16).status_code == 200


def test_health_gpu_out_of_memory_is_503() -> None:
    """Every GPU full (NVML snapshot): 503 gpu_out_of_memory."""
    report = health(Life.READY, 1, 1, 0, 0, 16, gpu_out_of_memory=True)
    assert report.status_code == 503
    assert report.body["status"] == "gpu_out_of_memory"
