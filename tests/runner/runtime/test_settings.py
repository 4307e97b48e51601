"""Configuration from the environment (runner/floor/settings.py)."""

from __future__ import annotations

import pytest

from runner.errors import ConfigError
from runner.floor.settings import load_settings
from tests.support import forkserver


def test_settings_defaults_match_the_contract() -> None:
    """With an empty environment the defaults are the seed's and the runner's documented ones."""
    s = load_settings({})
    assert (s.host, s.port, s.max_queue_depth, s.queue_timeout_ms) == ("0.0.0.0", 8080, 16, 30000)
    assert s.redis_url is None and s.models_config is None
    assert s.log_level == "info" and s.log_format == "json" and s.enable_metrics
    assert s.max_body_bytes == 8 * 1024 * 1024
    assert s.runner_id.startswith("quorum-")


def test_settings_read_every_seed_variable() -> None:
    """Every env var of the seed contract is read (the vLLM kind's own `VLLM_*`:
    tests/runner/runtime/test_settings_kinds.py)."""
    s = load_settings(
        {
            "CUDA_VISIBLE_DEVICES": "0,1",
            "HF_HOME": "/models/cache",
            "MODEL_BASE_PATH": "/models",
            "ENABLE_MULTI_TENANT": "true",
            "DEFAULT_RATE_LIMIT": "100req/min",
            "VERIFIED_OP_TOKEN_KEY_PATH": "/etc/k",
            "LOG_LEVEL": "DEBUG",
            "LOG_FORMAT": "text",
            "ENABLE_METRICS": "false",
            "METRICS_PORT": "9090",
            "MAX_QUEUE_DEPTH": "32",
            "QUEUE_TIMEOUT_MS": "5000",
        }
    )
    assert s.cuda_visible_devices == "0,1" and s.hf_home == "/models/cache"
    assert s.default_rate_limit == "100req/min"
    assert s.verified_op_token_key_path == "/etc/k" and s.log_level == "debug"
    assert not s.enable_metrics and s.metrics_port == 9090
    assert (s.max_queue_depth, s.queue_timeout_ms) == (32, 5000)


def test_settings_empty_value_means_unset() -> None:
    """An empty variable falls back to the default instead of failing."""
    assert load_settings({"PORT": "", "REDIS_URL": ""}).port == 8080


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_QUEUE_DEPTH", "lots"),
        ("MAX_QUEUE_DEPTH", "0"),
        ("PORT", "70000"),
        ("LOG_LEVEL", "loud"),
        ("LOG_FORMAT", "xml"),
        ("REDIS_URL", "http://x"),
        ("QUEUE_TIMEOUT_MS", "-1"),
        ("ENABLE_METRICS", "maybe"),
    ],
)
def test_settings_invalid_value_names_variable(name: str, value: str) -> None:
    """An invalid value raises ConfigError naming the variable."""
    with pytest.raises(ConfigError) as info:
        load_settings({name: value})
    assert name in str(info.value)


def test_settings_ignore_process_environment() -> None:
    """Only the mapping given is read (tests and tools pass their own)."""
    import os

    os.environ["MAX_QUEUE_DEPTH"] = "999"
    try:
        assert load_settings({}).max_queue_depth == 16
    finally:
        del os.environ["MAX_QUEUE_DEPTH"]


def test_settings_speech_and_jobs_defaults_and_values() -> None:
    """Audio and job settings: documented defaults, and read when given; the webhook
    secret never shows in the settings' repr (faster-whisper's own `WHISPER_*`:
    tests/runner/runtime/test_settings_kinds.py)."""
    s = load_settings({})
    assert s.audio_max_bytes == 26_214_400 and s.job_retention_s == 86_400
    assert s.webhook_secret is None
    secret = "whsec_" + "A" * 44
    s = load_settings(
        {
            "AUDIO_MAX_BYTES": "1048576",
            "WEBHOOK_SECRET": secret,
            "JOB_RETENTION_S": "60",
        }
    )
    assert s.audio_max_bytes == 1048576 and s.job_retention_s == 60
    assert s.webhook_secret is not None and s.webhook_secret.get_secret_value() == secret
    assert secret not in repr(s)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("AUDIO_MAX_BYTES", "10"),
        ("JOB_RETENTION_S", "0"),
    ],
)
def test_settings_invalid_speech_value_names_variable(name: str, value: str) -> None:
    """An invalid speech or job setting raises ConfigError naming the variable."""
    with pytest.raises(ConfigError) as info:
        load_settings({name: value})
    assert name in str(info.value)


@pytest.mark.parametrize("secret", ["s3cret-not-whsec", "whsec_!!notbase64", "whsec_c2hvcnQ="])
def test_settings_bad_webhook_secret_stops_start_up_naming_it(secret: str) -> None:
    """`quorum serve` with an unusable WEBHOOK_SECRET exits 2 naming the variable, and never
    prints the secret itself."""
    proc = forkserver.run(
        "runner", env={"WEBHOOK_SECRET": secret, "PATH": "/usr/bin:/bin", "PORT": "0"}, timeout=30
    )
    assert proc.returncode == 2, proc.stderr
    assert b"WEBHOOK_SECRET" in proc.stderr and secret.encode() not in proc.stderr


@pytest.mark.parametrize("path", ["/health", "/v1/capabilities", "/metricsx", "metrics"])
def test_settings_picker_metrics_path_cannot_take_another_route(path: str) -> None:
    """PICKER_METRICS_PATH is `/metrics` or a path under it: set to one of the API's own
    routes it would shadow it, so start-up refuses it, naming the variable."""
    with pytest.raises(ConfigError, match="PICKER_METRICS_PATH"):
        load_settings({"PICKER_METRICS_PATH": path})
    assert load_settings({"PICKER_METRICS_PATH": "/metrics"}).picker_metrics_path == "/metrics"


def test_settings_state_db_beside_usage_db_or_memory() -> None:
    """STATE_DB defaults to state.sqlite3 beside USAGE_DB; `memory` keeps no file; an
    explicit path is taken as given; STATE_DB_SYNC is full unless set to normal."""
    beside = load_settings({"USAGE_DB": "/var/lib/quorum/usage.sqlite3"})
    assert beside.state_db_path == "/var/lib/quorum/state.sqlite3"
    assert beside.state_db_sync == "full"
    assert load_settings({"STATE_DB": "memory"}).state_db_path is None
    given = load_settings({"STATE_DB": "/data/s.db", "STATE_DB_SYNC": "NORMAL"})
    assert (given.state_db_path, given.state_db_sync) == ("/data/s.db", "normal")
    with pytest.raises(ConfigError):
        load_settings({"STATE_DB_SYNC": "off"})
