"""How big a model is on disk, the memory the scheduler reserves while it loads, and the
policy the scheduler treats it by (pure, given what the GPU holds)."""

from __future__ import annotations

from runner.memory.estimate import estimate_mb, speech_worker_mb
from runner.memory.files import model_files
from runner.runtime.models_file import ModelSpec
from runner.scheduler.config import ModelPolicy


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


def policy_for(
    spec: ModelSpec,
    budget_mb: int | None,
    gpu_total_mb: int | None,
    vllm_gpu_memory_utilization: float,
    *,
    sleep_enabled: bool = False,
    on_gpu: bool = True,
) -> ModelPolicy:
    """How the scheduler treats `spec`: memory estimate, slots, pin, priority, ...

    1. An engine attached by URL is not our process: never evicted, holds none of our memory.
    2. A vLLM takes its `--gpu-memory-utilization` share of the GPU (`gpu_total_mb`, when
       known) whatever its weights weigh, so that share is its estimate when no budget is given.
    3. Whether an unload may put it to sleep (`sleep_refusal`: why not).
    4. The engine process it shares with other models (`slot_group`), whose slots it shares.
    """
    group = slot_group(spec)  # 4
    if spec.attached:  # 1
        return ModelPolicy(
            mem_mb=0, concurrency=spec.slots, pinned=True, sleep_refusal=_CANNOT_SLEEP,
            slot_group=group,
        )  # fmt: skip
    if spec.backend == "vllm" and budget_mb is None and gpu_total_mb is not None:  # 2
        budget_mb = round(gpu_total_mb * vllm_gpu_memory_utilization)
    return ModelPolicy(
        mem_mb=estimate_for(spec, budget_mb),
        concurrency=spec.slots,
        pinned=spec.pin,
        priority=spec.priority,
        autoload=spec.autoload,
        keep_alive_s=spec.keep_alive_s,
        restart=spec.restart,
        sleep_refusal=sleep_refusal(spec, sleep_enabled, on_gpu),  # 3
        slot_group=group,
    )


def slot_group(spec: ModelSpec) -> str | None:
    """The engine process `spec` shares with other models, if any (see
    `runner/scheduler/slot_groups.py`).

    1. ComfyUI: every model on one server shares its one queue, `comfyui:<url>` for a
       server attached by `url`, `comfyui:spawned` for the one the runner starts
       (`comfyui.ComfyUIServers.server_for` keys its servers the same way).
    2. vLLM attached by `url`: one `vllm serve` may serve several models: `vllm:<url>`.
    3. Otherwise its own process (a vLLM or llama-server the runner starts serves one
       model; an `openai` URL may be a gateway with capacity of its own): `None`.
    """
    url = spec.url.rstrip("/") if spec.url else None
    if spec.backend == "comfyui":  # 1
        return f"comfyui:{url or 'spawned'}"
    if spec.backend == "vllm" and url is not None:  # 2
        return f"vllm:{url}"
    return None  # 3


_CANNOT_SLEEP = "mode 'sleep' needs a vLLM model the runner started"


def sleep_refusal(spec: ModelSpec, sleep_enabled: bool, on_gpu: bool) -> str | None:
    """Why an unload of `spec` may not put it to sleep; None when it may."""
    if spec.backend != "vllm" or spec.attached:
        return _CANNOT_SLEEP
    if not sleep_enabled:
        return "mode 'sleep' needs VLLM_ENABLE_SLEEP_MODE=true"
    if not on_gpu:
        return (
            "mode 'sleep' frees nothing without a GPU (vLLM's sleep mode does nothing on "
            "a CPU); unload it with mode 'stop'"
        )
    return None
