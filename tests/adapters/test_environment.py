"""adapters/environment.py: what an engine takes of the runner's environment."""

from __future__ import annotations

from adapters.environment import engine_environment, matches

RUNNER = {
    "PATH": "/usr/bin",
    "LC_ALL": "C.UTF-8",
    "WEBHOOK_SECRET": "whsec_x",
    "GATEWAY_SECRET": "g" * 20,
    "REDIS_URL": "redis://:pw@redis:6379",
    "VLLM_CACHE_SALT_SECRET": "s" * 20,
    "VLLM_LOGGING_LEVEL": "INFO",
    "TENANTS_FILE": "/etc/quorum/tenants.yaml",
    "FAKE_KNOB": "1",
}


def test_engine_environment_keeps_common_and_declared_names_only() -> None:
    """An engine gets the common names and its kind's declared ones, nothing else."""
    env = engine_environment(RUNNER, ("VLLM_*",), {})
    assert env == {"PATH": "/usr/bin", "LC_ALL": "C.UTF-8", "VLLM_LOGGING_LEVEL": "INFO"}


def test_engine_environment_never_passes_a_secret_even_when_allowed() -> None:
    """A name NEVER matches is dropped whatever allowed it (the salt secret is VLLM_*,
    an operator allowing `*` gets no secret either)."""
    env = engine_environment({**RUNNER, "ENGINE_ENV_ALLOW": "*"}, ("VLLM_*",), {})
    assert not {"WEBHOOK_SECRET", "GATEWAY_SECRET", "REDIS_URL", "VLLM_CACHE_SALT_SECRET"} & set(
        env
    )


def test_engine_environment_operator_additions_and_runner_settings() -> None:
    """ENGINE_ENV_ALLOW adds names for every engine; what the runner sets for the engine
    (its key, its devices) wins."""
    env = engine_environment({**RUNNER, "ENGINE_ENV_ALLOW": "FAKE_*"}, (), {"PATH": "/x"})
    assert env["FAKE_KNOB"] == "1" and env["PATH"] == "/x"


def test_engine_environment_patterns() -> None:
    """`NAME` is exact, `PREFIX*` a prefix, `*TEXT*` a substring."""
    assert matches("LC_ALL", ["LC_*"]) and not matches("LC", ["LC_*"])
    assert matches("MY_SECRET_KEY", ["*SECRET*"]) and not matches("PATHS", ["PATH"])
