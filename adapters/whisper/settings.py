"""The faster-whisper kind's settings (adapters/kind_settings.py): `WHISPER_*`,
docs/configuration.md; and its own models-file field, `whisper_model`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from adapters.kind_settings import KindOptions, KindSettings

ComputeType = Literal[
    "default",
    "auto",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
]
"""CTranslate2's compute types."""


class WhisperSettings(KindSettings):
    """How the speech workers run (adapters/whisper/engine.py)."""

    model_config = SettingsConfigDict(env_prefix="WHISPER_")

    device: Literal["cpu", "cuda", "auto"] = "cpu"
    compute_type: ComputeType = "int8"
    cpu_threads: int = Field(default=0, ge=0, le=1024)  # 0: CTranslate2 decides
    load_timeout_s: float = Field(default=120.0, gt=0)
    allow_download: bool = False  # size names may be fetched from the Hub

    @field_validator("device", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class WhisperOptions(KindOptions):
    """A faster-whisper entry's own field: `whisper_model`, a size name (tiny.en ...
    large-v3) faster-whisper fetches or finds cached."""

    whisper_model: str | None = None
