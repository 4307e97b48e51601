"""faster-whisper as an engine kind (adapters/whisper/kind.py): its entries checked, its
worker sized, placed on GPUs only when asked."""

from __future__ import annotations

import pytest

from adapters.kind import EngineSettings, EngineSpec
from adapters.whisper.kind import WhisperKind, speech_worker_mb, whisper_model_arg
from adapters.whisper.settings import WhisperOptions
from faults import ConfigError


def test_speech_worker_mb_from_files_then_size_name() -> None:
    """A Whisper worker: its weights on disk x 1.5 + runtime; else its size name's
    family; else nothing known (the generic chain applies)."""
    assert speech_worker_mb(100 * 2**20, "large-v3") == 150 + 256
    assert speech_worker_mb(None, "tiny.en") == round(75 * 1.5) + 256
    assert speech_worker_mb(None, "distil-large-v3") == speech_worker_mb(None, "turbo")
    assert speech_worker_mb(None, "large-v3") == round(3090 * 1.5) + 256
    assert speech_worker_mb(None, None) is None


def test_whisper_kind_places_workers_on_gpus_only_off_the_cpu() -> None:
    """WHISPER_DEVICE=cpu: no GPU placement; cuda or auto: placed like any engine."""
    spec = EngineSpec("w", "faster-whisper", 1, options=WhisperOptions(whisper_model="tiny.en"))
    assert not WhisperKind(EngineSettings(environ={"WHISPER_DEVICE": "cpu"})).placed(spec)
    assert WhisperKind(EngineSettings(environ={"WHISPER_DEVICE": "CUDA"})).placed(spec)


def test_whisper_model_arg_names_a_missing_package() -> None:
    """A `package:` path whose package is not installed fails the load naming it."""
    spec = EngineSpec(
        "w", "faster-whisper", 1, path_text="package:nope/model", path_problem="not here"
    )
    with pytest.raises(ConfigError, match=r"package:nope/model.*not here"):
        whisper_model_arg(spec)
