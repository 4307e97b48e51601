"""How big a model is on disk, and the memory the scheduler reserves while it loads."""

from __future__ import annotations

from runner.memory.estimate import estimate_mb, speech_worker_mb
from runner.memory.files import model_files
from runner.models_config import ModelSpec


def model_size_mb(spec: ModelSpec) -> float:
    """Size of the model's weights on disk (0 when not on disk)."""
    path = spec.local_path()
    if path is None or not path.exists() or not (path.is_file() or path.is_dir()):
        return 0.0
    return model_files(path).size_bytes / 2**20


def estimate_for(spec: ModelSpec, budget_mb: int | None = None) -> int:
    """The memory estimate the scheduler reserves while `spec` loads (seed 000's chain)."""
    size = kind = None
    path = spec.local_path()
    if path is not None and path.exists():
        files = model_files(path)
        size, kind = files.size_bytes, files.kind
    if spec.backend == "faster-whisper" and budget_mb is None and spec.vram_mb is None:
        whisper_mb = speech_worker_mb(size, spec.whisper_model)
        if whisper_mb is not None:
            return whisper_mb
    return estimate_mb(
        budget_mb=budget_mb,
        vram_mb=spec.vram_mb,
        file_size_bytes=size,
        file_kind=kind,
        name=spec.id,
        quantization=spec.quantization,
    ).mb
