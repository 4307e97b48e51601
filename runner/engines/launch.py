"""How each backend's engine is started or attached (the I/O half of the adapters).

Each backend's function returns a `Launched`: the supervised process (None for an
engine attached by URL) and the engine that serves the model's requests. The command
lines themselves are pure functions in the adapters
(`adapters/llama_server/protocol.command_line`, `adapters/vllm/launch.command_line`).

Two kinds of engine, served by two request paths:

- an `Engine` (adapters/base.py): an HTTP engine the data path (or the image path)
  forwards to (llama-server, vLLM, ComfyUI, an engine attached by URL);
- a `WhisperEngine` (adapters/whisper): a speech worker the audio path sends files to
  over its private socket. It has no HTTP client to close: its channel is its own.

`Launched` hides that difference from the pool (`lost`, `close`); the pool files each
ready engine in the map its path reads (`ModelPool.engines`, `ModelPool.speech`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from adapters.base import Engine
from adapters.errors import EngineStartFailed
from adapters.http_client import EngineConnections
from adapters.llama_server.engine import LlamaServerEngine, LoraSlot
from adapters.llama_server.prefix_store import PrefixCache
from adapters.llama_server.protocol import (
    LLAMA_READY_MARKER,
    LaunchOptions,
    command_line,
    kv_flags,
    new_api_key,
)
from adapters.llama_server.slot_states import PublicText
from adapters.lora import LoraAdapter
from adapters.openai.engine import AttachedOpenAIEngine, Isolation
from adapters.supervisor import EngineProcess, HealthCheck, free_port
from adapters.whisper.engine import WhisperEngine
from faults import QuorumError
from runner.errors import ConfigError
from runner.runtime.models_file import PACKAGE_SCHEME, ModelSpec
from runner.runtime.settings import Settings

log = logging.getLogger("quorum.pool")
PERSIST_TIMEOUT_S = 30.0  # saving a stopping llama-server's slots (a few ms each)


@dataclass(frozen=True, slots=True)
class LoadParams:
    """What a load asks for beyond the models file (the seed's load body)."""

    max_context_length: int | None = None
    quantization: str | None = None
    gpu_memory_budget_mb: int | None = None


@dataclass
class Launched:
    """One model's engine as the pool holds it.

    `engine` is an `Engine` the data path forwards to (HTTP), or a `WhisperEngine` the
    audio path sends files to (module docstring). `process` is the engine process this
    model owns (stopped with it; None when attached by URL). `shared` is a process the
    model runs in without owning it (ComfyUI's server, which serves every ComfyUI model):
    watched for crashes, never stopped with the model; `release` then unloads the model
    from it and answers the MB that freed. `memory_mb` is what the launch measured itself
    (None: the pool measures `process`).
    """

    engine: Engine | WhisperEngine
    process: EngineProcess | None
    control: httpx.AsyncClient | None = None
    shared: EngineProcess | None = None
    release: Callable[[], Awaitable[int]] | None = None
    memory_mb: int | None = None
    watched: bool = False  # the pool registered its crash callback
    scratch: str | None = None  # a private directory removed with the engine (slot caches)

    @property
    def watch(self) -> EngineProcess | None:
        """The process whose death ends this model (its own, else the shared one)."""
        return self.process or self.shared

    @property
    def slots(self) -> int:
        return self.engine.slots

    def lost(self, reason: str) -> None:
        """The process died: requests still on the engine fail with `reason`.

        A WhisperEngine sees the exit itself (it watches the process and its channel) and
        has already failed its requests, naming the exit; an HTTP engine is told here and
        its connections dropped.
        """
        if isinstance(self.engine, WhisperEngine):
            return
        self.engine.failure = reason
        self.engine.http.close()

    def cut(self, error: QuorumError | None) -> None:
        """The runner is about to stop (or put to sleep) the engine under the requests
        still on it: they are answered `error` rather than the connection loss, or the
        speech worker's "stopped" (None: it serves again, after a wake-up)."""
        self.engine.cut = error

    async def close(self, grace_s: float) -> None:
        """Stop the engine (SIGTERM, `grace_s`, SIGKILL): its process ends, memory returns.
        A llama-server first saves its tenants' slots into the model's prefix cache."""
        if isinstance(self.engine, WhisperEngine):
            await self.engine.stop(grace_s)  # asks the worker to exit, then ends its group
        else:
            if isinstance(self.engine, LlamaServerEngine):
                try:
                    await asyncio.wait_for(self.engine.persist(), PERSIST_TIMEOUT_S)
                except (TimeoutError, QuorumError) as exc:
                    log.warning("model %s: saving its slots failed: %s", self.engine.model_id, exc)
            self.engine.http.close()
            if self.process is not None:
                await self.process.stop(grace_s)
        if self.control is not None:
            await self.control.aclose()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _health(client: httpx.AsyncClient) -> HealthCheck:
    """Ready when `GET /health` answers 200 (llama-server answers 503 while loading)."""

    async def check() -> bool:
        r = await client.get("/health")
        return r.status_code == 200

    return check


async def attach(spec: ModelSpec, settings: Settings, multi_tenant: bool) -> Launched:
    """An engine somebody else runs: forward to `spec.url`, isolate tenants by what we send."""
    assert spec.url is not None
    isolation: Isolation = "none"
    slots = spec.slots
    if spec.backend == "llama-server":
        slots = spec.parallel or await _reported_slots(spec.url) or slots
        if multi_tenant and spec.isolate_tenants:
            isolation = "cache_prompt_off"
    elif spec.backend == "openai" and multi_tenant and spec.isolate_tenants:
        log.warning(
            "model %s: generic OpenAI engine attached by URL; the runner cannot keep tenants "
            "apart in its prefix cache (mark it single_tenant or shared_cache to silence this)",
            spec.id,
        )
    if spec.shared_cache:
        log.warning("model %s: shared_cache is on: tenants share its prefix cache", spec.id)
    http = EngineConnections(
        spec.url, settings.engine_connect_timeout_s, settings.engine_read_timeout_s
    )
    return Launched(AttachedOpenAIEngine(spec.id, spec.url, slots, http, isolation), None)


async def _reported_slots(url: str) -> int | None:
    """llama-server's `/props` `total_slots`, when the engine reports it."""
    try:
        async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
            r = await client.get("/props")
            total = r.json().get("total_slots") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return total if isinstance(total, int) and total > 0 else None


async def start_llama_server(
    spec: ModelSpec,
    params: LoadParams,
    settings: Settings,
    env: Mapping[str, str],
    multi_tenant: bool,
    tensor_split: str | None = None,
    *,
    prefixes: PrefixCache,
    adapters: Sequence[LoraAdapter] = (),
) -> Launched:
    """Spawn llama-server for `spec` (with `adapters`, in that order) and wait until it is
    healthy (EngineStartFailed if not). Its `--slot-save-path` is the model's prefix cache
    folder (`prefixes`); its private scratch folder holds links to the adapter files."""
    model_path = spec.local_path()
    if model_path is None:
        raise ConfigError(f"model {spec.id!r}: backend llama-server needs a path to a GGUF file")
    port = free_port()
    key = new_api_key()
    scratch = tempfile.mkdtemp(prefix=f"quorum-llama-{port}-")  # 0700: the runner's alone
    try:
        key_file = os.path.join(scratch, ".api-key")  # never on the command line (`ps`)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(key + "\n")
        links = []
        for i, adapter in enumerate(adapters):  # no operator path (or comma) on its argv
            link = os.path.join(scratch, f"lora-{i}.gguf")
            os.symlink(os.path.abspath(os.path.expanduser(adapter.path)), link)
            links.append(link)
        binary = spec.executable(settings.llama_server_bin)
        opts = LaunchOptions(
            binary=binary,
            model_path=str(model_path),
            port=port,
            api_key_file=key_file,
            slots=spec.slots,
            slot_save_path=scratch,
            ctx_size=params.max_context_length or spec.context_length,
            n_gpu_layers=spec.n_gpu_layers,
            flash_attn=spec.flash_attn,
            embeddings=spec.embeddings,
            pooling=spec.pooling,
            tensor_split=tensor_split,
            swa_full=spec.swa_full,
            # llama-server splits --alias at commas (answers would name the first part)
            alias=spec.id if "," not in spec.id else None,
            lora_paths=tuple(links),
            extra_args=tuple(spec.args),
        )
        store = None
        if multi_tenant and spec.isolate_tenants and settings.llama_slot_cache_entries > 0:
            resolved = Path(shutil.which(binary) or binary)
            store = await asyncio.to_thread(
                prefixes.store_for, model_path, resolved, kv_flags(command_line(opts)),
                Path(scratch),
            )  # fmt: skip
            opts = replace(opts, slot_save_path=str(store.folder))
        url = f"http://127.0.0.1:{port}"
        # verify=False: plain http to 127.0.0.1, and it spares building an SSL context
        # (~36 ms of CPU each, inside the timed load).
        async with httpx.AsyncClient(base_url=url, timeout=2.0, verify=False) as probe:
            process = EngineProcess(
                name=spec.id,
                argv=command_line(opts),
                health=_health(probe),
                env=env,
                load_timeout_s=spec.load_timeout_s or settings.engine_load_timeout_s,
                ready_marker=LLAMA_READY_MARKER,
            )
            await process.start()
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    auth = {"Authorization": f"Bearer {key}"}
    control = httpx.AsyncClient(base_url=url, headers=auth, timeout=10.0, verify=False)
    if adapters:
        await _zero_global_scales(control, len(adapters), process, scratch)
    http = EngineConnections(
        url, settings.engine_connect_timeout_s, settings.engine_read_timeout_s, headers=auth
    )
    engine = LlamaServerEngine(
        spec.id,
        url,
        spec.slots,
        http,
        control,
        tenant_isolation=multi_tenant and spec.isolate_tenants,
        process=process,
        store=store,
        adapters={a.id: LoraSlot(i, a.scale, a.cache_key) for i, a in enumerate(adapters)},
        public=tuple(public_texts(spec)),
    )
    return Launched(engine, process, control, scratch=scratch)


async def _zero_global_scales(
    control: httpx.AsyncClient, n: int, process: EngineProcess, scratch: str
) -> None:
    """Every adapter's global scale set to 0 (`POST /lora-adapters`): a request that lists
    no `lora` runs with the global scales, and `--lora` starts them at 1.0 whatever
    `--lora-init-without-apply` says (seen on 11434: such a request ran with every adapter
    applied at once). The runner's requests always list theirs; this is the floor."""
    try:
        r = await control.post("/lora-adapters", json=[{"id": i, "scale": 0.0} for i in range(n)])
        r.raise_for_status()
    except httpx.HTTPError as exc:
        await control.aclose()
        await process.stop(1.0)
        shutil.rmtree(scratch, ignore_errors=True)
        raise EngineStartFailed(f"llama-server did not take its adapters' scales: {exc}") from None


def public_texts(spec: ModelSpec) -> list[PublicText]:
    """The model's declared public prefixes as the engine matches them: a chat's
    `prompt_prefix` starts with `system` NUL text; a completion's with its text."""
    return [
        PublicText(p.name, f"system\x00{p.system}", p.system, True)
        if p.system is not None
        else PublicText(p.name, p.prompt or "", p.prompt or "", False)
        for p in spec.public_prefixes
    ]


def whisper_model_arg(spec: ModelSpec) -> str:
    """What the speech worker loads: a CTranslate2 directory, an HF repo id, or a size name.

    A `package:` path whose package is not installed is a ConfigError naming it.
    """
    if spec.whisper_model is not None:
        return spec.whisper_model
    if spec.hf is not None:
        return spec.hf
    path = spec.local_path()
    if path is None:
        package = (spec.path or "").removeprefix(PACKAGE_SCHEME).partition("/")[0]
        raise ConfigError(
            f"model {spec.id!r}: path {spec.path!r}: Python package {package!r} is not "
            "installed (scripts/install)"
        )
    return str(path)


async def start_whisper(spec: ModelSpec, settings: Settings, env: Mapping[str, str]) -> Launched:
    """Spawn the speech worker for `spec` and wait for its Ready (EngineStartFailed if not).

    One process per model: CTranslate2 returns its memory only when the process ends, and
    a crash inside it must not take the runner down. `parallel` is CTranslate2's
    `num_workers` (transcriptions decoded side by side in that one process). A worker
    silent on a transcription for ENGINE_READ_TIMEOUT_S is killed: a crash.
    """
    worker_env = dict(env)
    if settings.hf_home:
        worker_env["HF_HOME"] = settings.hf_home
    engine = WhisperEngine(
        spec.id,
        whisper_model_arg(spec),
        device=settings.whisper_device,
        compute_type=settings.whisper_compute_type,
        parallel=spec.slots,
        cpu_threads=settings.whisper_cpu_threads,
        load_timeout_s=spec.load_timeout_s or settings.whisper_load_timeout_s,
        allow_download=settings.whisper_allow_download,
        env=worker_env,
        silence_s=settings.engine_read_timeout_s,
    )
    await engine.start()
    return Launched(engine, engine.process)
