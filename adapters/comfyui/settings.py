"""The ComfyUI kind's settings (adapters/kind_settings.py): `COMFYUI_*`,
docs/configuration.md."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from adapters.kind_settings import KindSettings


class ComfyUISettings(KindSettings):
    """Where the ComfyUI the runner starts lives, and how it runs."""

    model_config = SettingsConfigDict(env_prefix="COMFYUI_")

    path: str | None = None  # None: only servers attached by `url`
    python: str | None = None  # None: the runner's interpreter
    cpu: bool = False
    image_metadata: bool = False  # keep ComfyUI's workflow text chunks in the PNGs
