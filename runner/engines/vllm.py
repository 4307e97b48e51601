"""vLLM for the pool: `vllm serve` started per model (VLLM_BIN), or a vLLM attached by URL.

The command line is the adapter's (`adapters/vllm/launch.py`, pure); here the load
request and the settings are mapped onto it:

- `gpuMemoryBudgetMB` → `--gpu-memory-utilization` as a fraction of the GPU's total (the
  pool's telemetry: NVML, or RUNNER_MEMORY_MB without a GPU); else
  VLLM_GPU_MEMORY_UTILIZATION;
- `maxContextLength` (else the model's `context_length`, else VLLM_MAX_MODEL_LEN) →
  `--max-model-len`; `quantization` (the load's, else the model's) → `--quantization` /
  `--dtype` (an unknown one is a 400 before anything runs);
- `--max-num-seqs` = the model's slots, which is also the scheduler's concurrency cap;
- `--enable-prefix-caching` per VLLM_ENABLE_PREFIX_CACHING, `--enable-sleep-mode` per
  VLLM_ENABLE_SLEEP_MODE;
- LoRA adapters (the model's `adapters`, room for `max_adapters`): `--enable-lora`, the
  adapters' PEFT folders served from start (`--lora-modules`), more loaded later by a
  governed `adapter-load` (`/v1/load_lora_adapter`).

Tenants are kept apart by `cache_salt` (`adapters/vllm/salts.py`) for spawned and attached
engines alike, unless the model is `single_tenant` / `shared_cache` or ENABLE_MULTI_TENANT
is off.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence

from adapters.http_client import EngineConnections, control_client
from adapters.lora import LoraAdapter
from adapters.vllm.engine import (
    CacheSalts,
    VllmEngine,
    VllmMetricsCollector,
    launch,
    launch_options,
    new_api_key,
)
from runner.engines.launch import Launched, LoadParams
from runner.runtime.models_file import ModelSpec
from runner.runtime.settings import Settings

log = logging.getLogger("quorum.pool")

Measure = Callable[[int], Awaitable[int]]
"""MiB a process (and its children) holds: GPU memory with NVML, resident memory without."""


def model_source(spec: ModelSpec) -> str:
    """What `vllm serve` loads: the model's local directory, else its Hugging Face repo id,
    else its id (vLLM then fetches that repo itself)."""
    path = spec.local_path()
    if path is not None:
        return str(path)
    return spec.hf or spec.id


async def start_vllm(
    spec: ModelSpec,
    params: LoadParams,
    settings: Settings,
    env: Mapping[str, str],
    *,
    salts: CacheSalts | None,
    gpu_total_mb: int | None,
    metrics: VllmMetricsCollector | None,
    measure: Measure,
    adapters: Sequence[LoraAdapter] = (),
) -> Launched:
    """Spawn `vllm serve` for `spec` with `params` (and `adapters`); wait until `/health`
    answers 200.

    The engine's caches, temporary files and the Unix socket it listens on (no TCP port:
    adapters/vllm/launch.py) go to a private scratch folder (mode 0700), removed when the
    engine stops (`Launched.scratch`)."""
    scratch = tempfile.mkdtemp(prefix=f"quorum-vllm-{spec.id[:24]}-", dir=_short_tmp())
    for sub in ("cache", "tmp"):
        os.mkdir(os.path.join(scratch, sub))
    try:
        opts = launch_options(
            binary=spec.executable(settings.vllm_bin),
            model=model_source(spec),
            model_id=spec.id,
            port=None,
            uds=os.path.join(scratch, "engine.sock"),  # scratch: 0700, the runner's alone
            api_key=new_api_key(),
            slots=spec.slots,
            quantization=params.quantization or spec.quantization,
            max_context_length=params.max_context_length or spec.context_length,
            default_max_model_len=settings.vllm_max_model_len,
            gpu_memory_budget_mb=params.gpu_memory_budget_mb,
            gpu_total_mb=gpu_total_mb,
            default_gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
            enable_prefix_caching=settings.vllm_enable_prefix_caching,
            enable_sleep_mode=settings.vllm_enable_sleep_mode,
            scratch_dir=scratch,
            lora_modules=[(a.name, a.path) for a in adapters],
            adapter_capacity=max(spec.adapter_capacity, len(adapters)),
            lora_ranks=[a.rank for a in adapters],
            extra_args=spec.args,
        )
        process, engine = await launch(
            opts,
            salts=salts,
            load_timeout_s=spec.load_timeout_s or settings.engine_load_timeout_s,
            connect_timeout_s=settings.engine_connect_timeout_s,
            read_timeout_s=settings.engine_read_timeout_s,
            env=env,
            metrics_sink=metrics,
        )
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    pid = process.pid

    async def probe() -> int | None:
        return await measure(pid) if pid is not None else None

    engine.memory_probe = probe  # sleep and wake-up report the memory measured after
    engine.adapters = {a.id: a.name for a in adapters}
    return Launched(engine, process, engine.control, scratch=scratch)


def _short_tmp() -> str:
    """The temporary folder, unless its path is too long for a Unix socket inside it
    (108 bytes in all on Linux): then /tmp."""
    folder = tempfile.gettempdir()
    return folder if len(folder) <= 48 else "/tmp"


def attach_vllm(
    spec: ModelSpec,
    settings: Settings,
    *,
    salts: CacheSalts | None,
    metrics: VllmMetricsCollector | None,
) -> Launched:
    """A vLLM somebody else runs at `spec.url` (its served model name must be the model's id).

    The runner cannot stop, sleep or measure it; it salts every request (tenants apart),
    reads its `/metrics` and can reset its prefix cache when it runs in dev mode.
    """
    assert spec.url is not None
    url = spec.url.rstrip("/")
    if salts is None and spec.shared_cache:
        log.warning("model %s: shared_cache is on: tenants share vLLM's prefix cache", spec.id)
    control = control_client(url, timeout=30.0)
    http = EngineConnections(url, settings.engine_connect_timeout_s, settings.engine_read_timeout_s)
    engine = VllmEngine(spec.id, url, spec.slots, http, control, salts, metrics_sink=metrics)
    return Launched(engine, None, control)
