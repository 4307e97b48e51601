"""compose.yaml stays consistent with the settings the runner reads (no Docker engine here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from runner.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def test_compose_runner_environment_names_known_settings() -> None:
    """Every variable compose sets on a runner is one the runner reads."""
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    known = {name.upper() for name in Settings.model_fields}
    runners = [s for name, s in doc["services"].items() if name.startswith("runner")]
    assert len(runners) == 2
    for service in runners:
        env = service["environment"]
        assert set(env) <= known, set(env) - known
        assert env["REDIS_URL"].startswith("redis://redis:")
    assert {"redis", "prometheus"} <= set(doc["services"])
