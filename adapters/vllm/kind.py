"""vLLM as an engine kind: `vllm serve` started per model (VLLM_BIN), or a vLLM attached by URL.

The command line is `launch.py`'s (pure); here the load request and the settings are
mapped onto it:

- `gpuMemoryBudgetMB` → `--gpu-memory-utilization` as a fraction of the GPU's total (the
  pool's telemetry: NVML, or RUNNER_MEMORY_MB without a GPU); else
  VLLM_GPU_MEMORY_UTILIZATION, which is also the share of its GPU the scheduler reserves
  for it (`memory_share`);
- `maxContextLength` (else the model's `context_length`, else VLLM_MAX_MODEL_LEN) →
  `--max-model-len`; `quantization` (the load's, else the model's) → `--quantization` /
  `--dtype` (an unknown one is a 400 before anything runs);
- `--max-num-seqs` = the model's slots, which is also the scheduler's concurrency cap;
- `--enable-prefix-caching` per VLLM_ENABLE_PREFIX_CACHING, `--enable-sleep-mode` per
  VLLM_ENABLE_SLEEP_MODE (an unload may then put it to sleep: `sleep_refusal`);
- the runner tracing (OTEL_*, ENGINE_TRACES): `--otlp-traces-endpoint` to the runner's
  collector, so vLLM's spans (`llm_request`, its start-up) join the runner's traces;
- LoRA adapters (the model's `adapters`, room for `max_adapters`: `adapter_room`):
  `--enable-lora`, the adapters' PEFT folders served from start (`--lora-modules`), more
  loaded later by a governed `adapter-load` (`/v1/load_lora_adapter`, in place).

A vLLM the runner starts listens on a Unix socket in its private scratch folder (mode
0700), on no TCP port: its `/metrics`, `/health` and dev routes answer whoever can
connect, and only the runner's user can (`launch.py`); its API key is generated per
engine and handed over in the environment (VLLM_API_KEY), never on its command line.

Tenants are kept apart by `cache_salt` (`salts.py`) for spawned and attached engines
alike, unless the model is `single_tenant` / `shared_cache` or ENABLE_MULTI_TENANT is off;
a model's salts are kept across reloads and sleep, so a flush's rotation is never undone
by a reload. Its engines report their own KV cache and queue (`/metrics`, whose families
the runner re-exposes) and version (`/version`); models attached at one `url` share that
server's slots (`slot_group`).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Mapping

from adapters.engine_urls import control_client, unix_url
from adapters.features import Features
from adapters.http_client import EngineConnections
from adapters.kind import (
    CANNOT_SLEEP,
    Devices,
    EngineFamilies,
    EngineSettings,
    EngineSpec,
    Host,
    KindDefaults,
    LoadGuess,
    Traits,
)
from adapters.launched import EngineLoad, Launched
from adapters.supervisor import EngineProcess
from adapters.trace_context import current_traceparent
from adapters.vllm.engine import CacheSalts, MemoryProbe, VllmEngine
from adapters.vllm.fields import VLLM_FIELDS
from adapters.vllm.launch import (
    VLLM_ENVIRONMENT,
    VllmLaunchOptions,
    command_line,
    engine_env,
    launch_options,
    new_api_key,
    start,
)
from adapters.vllm.prompt_tokens import VllmPromptCounter
from adapters.vllm.settings import VllmSettings

log = logging.getLogger("quorum.pool")

NAME = "vllm"


def model_source(spec: EngineSpec) -> str:
    """What `vllm serve` loads: the model's local directory, else its Hugging Face repo id,
    else its id (vLLM then fetches that repo itself)."""
    if spec.path is not None:
        return str(spec.path)
    return spec.hf or spec.model_id


def launched(engine: VllmEngine, scratch: str | None = None) -> Launched:
    """What a vLLM engine can do, for the pool (`scratch`: its private folder, removed
    when it stops)."""

    async def load() -> EngineLoad:
        scraped = await engine.scrape()
        return EngineLoad(
            engine.kv_size_mb, scraped.kv_cache_usage, scraped.waiting, scraped.running
        )

    return Launched(
        engine,
        engine.process,
        url=engine.base_url,
        control=engine.control,
        scratch=scratch,
        chat=engine,
        tokens=VllmPromptCounter(engine.http),
        flush=engine.flush,
        standby=engine if engine.process is not None else None,
        load=load,
        version=engine.version,
        adapters=engine if engine.process is not None else None,
    )


class VllmKind(KindDefaults):
    name = NAME
    traits = Traits(
        request_path="chat",
        default_parallel=32,
        probe_path="/health",
        kv_cache=True,
        reports_kv=True,
        # it imports, profiles and warms up for ~30 s before its weights count (on the CPU)
        load_guess=LoadGuess(30.0, 50.0),
        catalog_rank=1,
        own_fields=frozenset({"adapters", "max_adapters"}),
        adapters=True,
        request_fields=VLLM_FIELDS,
        environment=VLLM_ENVIRONMENT,
    )

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.own = VllmSettings.read(settings.environ)
        secret = self.own.cache_salt_secret
        self._secret = secret.encode() if secret else secrets.token_bytes(32)
        self._salts: dict[str, CacheSalts] = {}

    def features(self, spec: EngineSpec) -> Features:
        """Streams; caches prefixes unless VLLM_ENABLE_PREFIX_CACHING is off (the runner
        starts it with `--no-enable-prefix-caching`; an attached one is assumed to follow)."""
        return Features(streaming=True, prefix_caching=self.own.enable_prefix_caching)

    def slot_group(self, spec: EngineSpec) -> str | None:
        """One `vllm serve` attached by `url` may serve several models: `vllm:<url>`."""
        return f"vllm:{spec.url.rstrip('/')}" if spec.url else None

    def sleep_refusal(self, spec: EngineSpec, on_gpu: bool) -> str | None:
        if spec.attached:
            return CANNOT_SLEEP
        if not self.own.enable_sleep_mode:
            return "mode 'sleep' needs VLLM_ENABLE_SLEEP_MODE=true"
        if not on_gpu:
            return (
                "mode 'sleep' frees nothing without a GPU (vLLM's sleep mode does nothing on "
                "a CPU); unload it with mode 'stop'"
            )
        return None

    def adapter_room(self, spec: EngineSpec) -> int | None:
        """`--max-loras` is fixed at start: `max_adapters`, else the adapters declared."""
        return spec.adapter_room

    def memory_share(self, spec: EngineSpec) -> float | None:
        return None if spec.attached else self.own.gpu_memory_utilization

    def salts(self, spec: EngineSpec) -> CacheSalts | None:
        """The model's cache salts; None when its tenants may share vLLM's prefix cache."""
        if not (self.settings.multi_tenant and spec.isolate_tenants):
            return None
        if spec.model_id not in self._salts:
            self._salts[spec.model_id] = CacheSalts(self._secret)
        return self._salts[spec.model_id]

    async def start(self, spec: EngineSpec, devices: Devices, host: Host) -> Launched:
        """Spawn `vllm serve` for `spec` (and its `adapters`); wait until `/health`
        answers 200.

        The engine's caches, temporary files and the Unix socket it listens on go to a
        private scratch folder (mode 0700), removed when the engine stops
        (`Launched.scratch`)."""
        s, own = self.settings, self.own
        total = host.gpu_total_mb(spec.gpus) if spec.gpu_memory_budget_mb else None
        scratch = tempfile.mkdtemp(prefix=f"quorum-vllm-{spec.model_id[:24]}-", dir=_short_tmp())
        for sub in ("cache", "tmp"):
            os.mkdir(os.path.join(scratch, sub))
        try:
            if own.model_info_dir:
                keep_model_info(scratch, own.model_info_dir)
            opts = launch_options(
                binary=spec.executable(own.bin),
                model=model_source(spec),
                model_id=spec.model_id,
                port=None,
                uds=os.path.join(scratch, "engine.sock"),  # scratch: 0700, the runner's alone
                api_key=new_api_key(),
                slots=spec.slots,
                quantization=spec.quantization,
                max_context_length=spec.context_length,
                default_max_model_len=own.max_model_len,
                gpu_memory_budget_mb=spec.gpu_memory_budget_mb,
                gpu_total_mb=total,
                default_gpu_memory_utilization=own.gpu_memory_utilization,
                enable_prefix_caching=own.enable_prefix_caching,
                enable_sleep_mode=own.enable_sleep_mode,
                scratch_dir=scratch,
                lora_modules=[(a.name, a.path) for a in spec.adapters],
                adapter_capacity=max(spec.adapter_room, len(spec.adapters)),
                lora_ranks=[a.rank for a in spec.adapters],
                extra_args=list(spec.args),
                otlp_traces=s.otlp_traces,
                traceparent=current_traceparent() if s.otlp_traces is not None else None,
            )
            process, engine = await launch(
                opts,
                salts=self.salts(spec),
                load_timeout_s=spec.load_timeout_s or s.load_timeout_s,
                connect_timeout_s=s.connect_timeout_s,
                read_timeout_s=s.read_timeout_s,
                env=devices.env,
                metrics_sink=host.families,
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        pid = process.pid

        async def probe() -> int | None:
            return await host.measure_mb(pid) if pid is not None else None

        engine.memory_probe = probe  # sleep and wake-up report the memory measured after
        engine.adapters = {a.id: a.name for a in spec.adapters}
        return launched(engine, scratch)

    async def attach(self, spec: EngineSpec, host: Host) -> Launched:
        """A vLLM somebody else runs at `spec.url` (its served model name must be the
        model's id). The runner cannot stop, sleep or measure it; it salts every request
        (tenants apart), reads its `/metrics` and can reset its prefix cache when it runs
        in dev mode."""
        assert spec.url is not None
        url = spec.url.rstrip("/")
        salts = self.salts(spec)
        if salts is None and spec.shared_cache:
            log.warning(
                "model %s: shared_cache is on: tenants share vLLM's prefix cache", spec.model_id
            )
        s = self.settings
        control = control_client(url, timeout=30.0)
        http = EngineConnections(url, s.connect_timeout_s, s.read_timeout_s)
        engine = VllmEngine(
            spec.model_id, url, spec.slots, http, control, salts, metrics_sink=host.families
        )
        return launched(engine)


async def launch(
    opts: VllmLaunchOptions,
    *,
    salts: CacheSalts | None,
    load_timeout_s: float,
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 300.0,
    env: Mapping[str, str] | None = None,
    memory_probe: MemoryProbe | None = None,
    metrics_sink: EngineFamilies | None = None,
    force_stream_usage: bool = True,
) -> tuple[EngineProcess, VllmEngine]:
    """Spawn `vllm serve` for `opts`, wait until `/health` answers 200, build its engine.

    The process gets `env` (the runner's additions) and `engine_env(opts)`; a start failure
    raises `EngineStartFailed` / `EngineOutOfMemory` with vLLM's root cause first.
    """
    url = unix_url(opts.uds) if opts.uds is not None else f"http://127.0.0.1:{opts.port}"
    auth = {"Authorization": f"Bearer {opts.api_key}"}
    control = control_client(url, headers=auth, timeout=30.0)

    async def healthy() -> bool:
        r = await control.get("/health", timeout=2.0)
        return r.status_code == 200

    process = EngineProcess(
        name=opts.served_model_name,
        argv=command_line(opts),
        health=healthy,
        env={**(env or {}), **engine_env(opts)},
        inherit=VLLM_ENVIRONMENT,
        load_timeout_s=load_timeout_s,
    )
    try:
        await start(process)
    except BaseException:
        await control.aclose()
        raise
    engine = VllmEngine(
        model_id=opts.served_model_name,
        base_url=url,
        slots=opts.max_num_seqs,
        http=EngineConnections(url, connect_timeout_s, read_timeout_s, headers=auth),
        control=control,
        salts=salts,
        force_stream_usage=force_stream_usage,
        memory_probe=memory_probe,
        metrics_sink=metrics_sink,
        process=process,
    )
    engine.lora_enabled = opts.max_loras > 0
    engine.read_startup_log(process.logs())
    return process, engine


def keep_model_info(scratch: str, folder: str) -> None:
    """Link the engine's `<scratch>/cache/modelinfos` to `folder` (made, mode 0700, if
    missing). vLLM inspects the model's class in a subprocess that imports torch and vLLM
    again, unless `$VLLM_CACHE_ROOT/modelinfos` holds the result for that class's source
    (vllm/model_executor/models/registry.py: a file per class, keyed by its source's hash):
    kept there, every start after the first skips it (seconds to tens of seconds on a CPU).
    The link goes with the scratch folder; `folder` stays."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.symlink(os.path.abspath(folder), os.path.join(scratch, "cache", "modelinfos"))


def _short_tmp() -> str:
    """The temporary folder, unless its path is too long for a Unix socket inside it
    (108 bytes in all on Linux): then /tmp."""
    folder = tempfile.gettempdir()
    return folder if len(folder) <= 48 else "/tmp"
