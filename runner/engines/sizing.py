"""How big a model is on disk, the memory the scheduler reserves while it loads, and the
policy the scheduler treats it by (given what the GPU holds and its engine kind). Not pure:
each reads the model's files on disk (`model_files`: which exist, their sizes)."""

from __future__ import annotations

from runner.engines.kinds import EngineKinds
from runner.floor.models_file import ModelSpec
from runner.memory.estimate import estimate_mb
from runner.memory.files import model_files
from runner.scheduler.config import ModelPolicy


def model_size_mb(spec: ModelSpec) -> float:
    """Size of the model's weights on disk (0 when not on disk)."""
    path = spec.local_path()
    if path is None or not path.exists() or not (path.is_file() or path.is_dir()):
        return 0.0
    return model_files(path).size_bytes / 2**20


def estimate_for(spec: ModelSpec, kinds: EngineKinds, budget_mb: int | None = None) -> int:
    """The memory estimate the scheduler reserves while `spec` loads.

    1. No budget and no `vram_mb`: the kind's own estimate, when it has one (a speech
       worker's weights).
    2. Otherwise seed 000's chain (`runner/memory/estimate.py`).
    """
    size = kind = None
    path = spec.local_path()
    if path is not None and path.exists():
        files = model_files(path)
        size, kind = files.size_bytes, files.kind
    if budget_mb is None and spec.vram_mb is None:  # 1
        own = kinds.of(spec).estimate_mb(kinds.engine_spec(spec), size)
        if own is not None:
            return own
    return estimate_mb(  # 2
        budget_mb=budget_mb,
        vram_mb=spec.vram_mb,
        file_size_bytes=size,
        file_kind=kind,
        name=spec.id,
        quantization=spec.quantization,
    ).mb


def policy_for(
    spec: ModelSpec,
    kinds: EngineKinds,
    budget_mb: int | None,
    gpu_total_mb: int | None,
    *,
    on_gpu: bool = True,
) -> ModelPolicy:
    """How the scheduler treats `spec`: memory estimate, slots, pin, priority, ...

    1. An engine attached by URL is not our process: never evicted, holds none of our memory.
    2. A kind that takes a share of its GPU whatever its weights weigh (vLLM's
       `--gpu-memory-utilization`) has that share of `gpu_total_mb`, when known, as its
       estimate when no budget is given.
    3. Whether an unload may put it to sleep (`sleep_refusal`: why not).
    4. The engine process it shares with other models (`slot_group`), whose slots it shares.
    """
    kind = kinds.of(spec)
    engine = kinds.engine_spec(spec)
    group = kind.slot_group(engine)  # 4
    refusal = kind.sleep_refusal(engine, on_gpu)  # 3
    if spec.attached:  # 1
        return ModelPolicy(
            mem_mb=0,
            concurrency=engine.slots,
            pinned=True,
            sleep_refusal=refusal,
            slot_group=group,
        )
    share = kind.memory_share(engine)  # 2
    if share is not None and budget_mb is None and gpu_total_mb is not None:
        budget_mb = round(gpu_total_mb * share)
    return ModelPolicy(
        mem_mb=estimate_for(spec, kinds, budget_mb),
        concurrency=engine.slots,
        pinned=spec.pin,
        priority=spec.priority,
        autoload=spec.autoload,
        keep_alive_s=spec.keep_alive_s,
        restart=spec.restart,
        sleep_refusal=refusal,
        slot_group=group,
    )
