"""Each engine kind's own settings (adapters/<kind>/settings.py), read as `quorum serve`
reads them at start (the settings, then the kind table): the same variables and
defaults as when `Settings` held them, and a bad value refused naming its variable."""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

from adapters.comfyui.kind import ComfyUIKind
from adapters.llama_server.kind import LlamaServerKind
from adapters.vllm.kind import VllmKind
from adapters.whisper.kind import WhisperKind
from runner.engines.kinds import EngineKinds
from runner.errors import ConfigError
from runner.floor.settings import load_settings
from runner.runtime.cli import app_from_environment

PREFIXES = os.path.join(
    os.environ.get("QUORUM_CACHE") or os.path.expanduser("~/.cache/quorum"), "prefixes"
)

# variable: (its default, a value set, what the kind reads for it)
KNOBS: dict[str, tuple[object, str, object]] = {
    "VLLM_ENABLE_PREFIX_CACHING": (True, "false", False),
    "VLLM_MAX_MODEL_LEN": (None, "32768", 32768),
    "VLLM_GPU_MEMORY_UTILIZATION": (0.9, "0.8", 0.8),
    "VLLM_BIN": ("vllm", "/opt/vllm", "/opt/vllm"),
    "VLLM_ENABLE_SLEEP_MODE": (False, "true", True),
    "VLLM_CACHE_SALT_SECRET": (None, "s" * 16, "s" * 16),
    "VLLM_MODEL_INFO_DIR": (None, "/var/cache/quorum/model-info", "/var/cache/quorum/model-info"),
    "COMFYUI_PATH": (None, "/opt/comfy", "/opt/comfy"),
    "COMFYUI_PYTHON": (None, "/usr/bin/python3", "/usr/bin/python3"),
    "COMFYUI_CPU": (False, "true", True),
    "COMFYUI_IMAGE_METADATA": (False, "1", True),
    "WHISPER_DEVICE": ("cpu", "CUDA", "cuda"),
    "WHISPER_COMPUTE_TYPE": ("int8", "float16", "float16"),
    "WHISPER_CPU_THREADS": (0, "4", 4),
    "WHISPER_LOAD_TIMEOUT_S": (120.0, "30", 30.0),
    "WHISPER_ALLOW_DOWNLOAD": (False, "true", True),
    "LLAMA_SERVER_BIN": (None, "/opt/llama-server", "/opt/llama-server"),
    "LLAMA_SLOT_CACHE_ENTRIES": (64, "0", 0),
    "PREFIX_CACHE_DIR": (PREFIXES, "/var/prefixes", "/var/prefixes"),
    "PREFIX_CACHE_PERSIST": (True, "false", False),
    "PREFIX_CACHE_MAX_MB": (2048, "10", 10),
    "PREFIX_CACHE_TTL_S": (86_400.0, "60", 60.0),
}


def knobs(env: Mapping[str, str]) -> dict[str, object]:
    """Every kind's settings, by variable, as the kinds built at start read them."""
    kinds = EngineKinds.from_settings(load_settings(env))
    read: dict[str, object] = {}
    for name, cls in (
        ("vllm", VllmKind),
        ("comfyui", ComfyUIKind),
        ("faster-whisper", WhisperKind),
        ("llama-server", LlamaServerKind),
    ):
        kind = kinds.named(name)
        assert isinstance(kind, cls)
        own = kind.own
        read |= {var: getattr(own, field) for var, field in own.variables().items()}
    return read


def test_kind_settings_keep_their_variables_and_defaults() -> None:
    """With nothing set every kind reads the documented defaults; each variable, named as
    before (case-insensitive), sets its knob; an empty value counts as unset."""
    read = knobs({})
    assert set(read) == set(KNOBS)
    assert {var: read[var] for var in KNOBS} == {var: d for var, (d, _, _) in KNOBS.items()}
    given = knobs({var.lower(): value for var, (_, value, _) in KNOBS.items()})
    assert given == {var: want for var, (_, _, want) in KNOBS.items()}
    assert knobs({"VLLM_BIN": "", "PREFIX_CACHE_MAX_MB": ""})["VLLM_BIN"] == "vllm"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VLLM_GPU_MEMORY_UTILIZATION", "1.5"),
        ("VLLM_GPU_MEMORY_UTILIZATION", "0"),
        ("VLLM_MAX_MODEL_LEN", "0"),
        ("VLLM_ENABLE_PREFIX_CACHING", "maybe"),
        ("VLLM_CACHE_SALT_SECRET", "short"),
        ("COMFYUI_CPU", "perhaps"),
        ("WHISPER_DEVICE", "tpu"),
        ("WHISPER_COMPUTE_TYPE", "int3"),
        ("WHISPER_CPU_THREADS", "-1"),
        ("WHISPER_LOAD_TIMEOUT_S", "0"),
        ("LLAMA_SLOT_CACHE_ENTRIES", "100001"),
        ("PREFIX_CACHE_MAX_MB", "0"),
        ("PREFIX_CACHE_TTL_S", "never"),
    ],
)
def test_kind_settings_refuse_a_bad_value_naming_it(name: str, value: str) -> None:
    """A bad value of a kind's variable stops the start: ConfigError naming it."""
    with pytest.raises(ConfigError, match=f"invalid configuration: {name}=") as info:
        knobs({name: value})
    assert repr(value) in str(info.value)


def test_serve_refuses_a_bad_kind_setting_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`quorum serve`'s start-up reads every kind's settings: a bad
    VLLM_GPU_MEMORY_UTILIZATION is the one-line reason it exits 2 with."""
    monkeypatch.setenv("VLLM_GPU_MEMORY_UTILIZATION", "2")
    refused = app_from_environment()
    assert isinstance(refused, str)
    assert refused.startswith("invalid configuration: VLLM_GPU_MEMORY_UTILIZATION='2'")
