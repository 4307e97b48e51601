"""The models file (`MODELS_CONFIG`, YAML): which models this runner serves and how.

    models:
      - id: echo                  # the name clients send as "model"
        backend: openai           # an OpenAI-compatible engine that is already running
        url: http://127.0.0.1:9000
        parallel: 8               # requests in flight at the engine at once

Models with a `url` are attached at start-up and count as loaded. Backends the
runner starts itself (llama-server, vllm, comfyui, faster-whisper) come with the
engine issues; their fields are accepted here so files stay forward-compatible,
but such a backend is refused at start-up until its adapter exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runner.errors import ConfigError

Backend = Literal["openai", "llama-server", "vllm", "comfyui", "faster-whisper"]
SUPPORTED_BACKENDS: frozenset[str] = frozenset({"openai"})
DEFAULT_PARALLEL: dict[str, int] = {
    "openai": 8,
    "llama-server": 1,
    "vllm": 32,
    "comfyui": 1,
    "faster-whisper": 1,
}


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=256)
    backend: Backend
    url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    parallel: int | None = Field(default=None, ge=1, le=4096)
    path: str | None = None
    hf: str | None = None
    vram_mb: int | None = Field(default=None, ge=0)
    context_length: int | None = Field(default=None, ge=1)
    pin: bool = False
    keep_alive_s: float | None = Field(default=None, ge=0)
    priority: int = 0
    load_timeout_s: float | None = Field(default=None, gt=0)
    args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.backend == "openai" and not self.url:
            raise ValueError("backend 'openai' needs a url")
        return self

    @property
    def slots(self) -> int:
        """Requests this model may have in flight at its engine."""
        return self.parallel or DEFAULT_PARALLEL[self.backend]


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[ModelSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> ModelsFile:
        seen: set[str] = set()
        for m in self.models:
            if m.id in seen:
                raise ValueError(f"model id {m.id!r} appears twice")
            seen.add(m.id)
        return self


def load_models_file(path: str | None) -> ModelsFile:
    """Parse and validate the models file; no file means no models.

    Raises ConfigError naming MODELS_CONFIG, the entry and the problem.
    """
    if path is None:
        return ModelsFile()
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"MODELS_CONFIG={path!r}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"MODELS_CONFIG={path!r}: not valid YAML: {exc}") from None
    if raw is None or (isinstance(raw, dict) and raw.get("models", ()) is None):
        raw = {"models": []}  # an empty file, or "models:" with nothing under it
    try:
        parsed = ModelsFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"MODELS_CONFIG={path!r}: {problems}") from None
    for m in parsed.models:
        if m.backend not in SUPPORTED_BACKENDS:
            raise ConfigError(
                f"MODELS_CONFIG={path!r}: model {m.id!r}: backend {m.backend!r} "
                "is not available in this version (supported: openai)"
            )
    return parsed
