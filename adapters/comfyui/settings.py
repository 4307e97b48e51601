"""The ComfyUI kind's settings (adapters/kind_settings.py): `COMFYUI_*`,
docs/configuration.md; and its own models-file fields, `workflow` and `checkpoint`."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from adapters.kind_settings import KindOptions, KindSettings


class ComfyUISettings(KindSettings):
    """Where the ComfyUI the runner starts lives, and how it runs."""

    model_config = SettingsConfigDict(env_prefix="COMFYUI_")

    path: str | None = None  # None: only servers attached by `url`
    python: str | None = None  # None: the runner's interpreter
    cpu: bool = False
    image_metadata: bool = False  # keep ComfyUI's workflow text chunks in the PNGs


class ComfyUIOptions(KindOptions):
    """A comfyui entry's own fields."""

    workflow: str | None = None  # a built-in template name or a template file
    checkpoint: str | None = None  # the checkpoint file name ComfyUI lists
