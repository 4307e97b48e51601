"""The vLLM kind's settings (adapters/kind_settings.py): `VLLM_*`, docs/configuration.md.
The first three are the seed contract's."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from adapters.kind_settings import KindSettings


class VllmSettings(KindSettings):
    """How the runner starts vLLM (adapters/vllm/launch.py) and salts its cache."""

    model_config = SettingsConfigDict(env_prefix="VLLM_")

    enable_prefix_caching: bool = True
    max_model_len: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    bin: str = "vllm"
    enable_sleep_mode: bool = False
    cache_salt_secret: str | None = Field(default=None, min_length=16)
    model_info_dir: str | None = None  # vLLM's model-class inspection, kept between starts
