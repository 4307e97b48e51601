"""Configuration from the environment (runner/settings.py)."""

from __future__ import annotations

import pytest

from runner.errors import ConfigError
from runner.settings import load_settings


def test_settings_defaults_match_the_contract() -> None:
    """With an empty environment the defaults are the seed's and the runner's documented ones."""
    s = load_settings({})
    assert (s.host, s.port, s.max_queue_depth, s.queue_timeout_ms) == ("0.0.0.0", 8080, 16, 30000)
    assert s.redis_url is None and s.models_config is None
    assert s.log_level == "info" and s.log_format == "json" and s.enable_metrics
    assert s.max_body_bytes == 8 * 1024 * 1024
    assert s.runner_id.startswith("quorum-")


def test_settings_read_every_seed_variable() -> None:
    """Every env var of the seed contract is read."""
    s = load_settings(
        {
            "CUDA_VISIBLE_DEVICES": "0,1",
            "HF_HOME": "/models/cache",
            "MODEL_BASE_PATH": "/models",
            "VLLM_ENABLE_PREFIX_CACHING": "false",
            "VLLM_MAX_MODEL_LEN": "32768",
            "VLLM_GPU_MEMORY_UTILIZATION": "0.8",
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
    assert not s.vllm_enable_prefix_caching and s.vllm_max_model_len == 32768
    assert s.vllm_gpu_memory_utilization == 0.8 and s.default_rate_limit == "100req/min"
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
        ("VLLM_GPU_MEMORY_UTILIZATION", "1.5"),
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
