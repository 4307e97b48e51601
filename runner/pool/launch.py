"""How each backend's engine is started or attached (the I/O half of the adapters).

`launch(spec, params, env)` returns a `Launched`: the supervised process (None for an
engine attached by URL) and the `Engine` the data path uses. The command lines
themselves are pure functions in the adapters (`adapters/llama_server.command_line`).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx

from adapters.base import Engine
from adapters.llama_server import LaunchOptions, LlamaServerEngine, command_line, new_api_key
from adapters.openai import AttachedOpenAIEngine, Isolation
from adapters.supervisor import EngineProcess, HealthCheck, free_port
from runner.engine_client import Pool
from runner.errors import ConfigError
from runner.models_config import ModelSpec
from runner.settings import Settings

log = logging.getLogger("quorum.pool")


@dataclass(frozen=True, slots=True)
class LoadParams:
    """What a load asks for beyond the models file (the seed's load body)."""

    max_context_length: int | None = None
    quantization: str | None = None
    gpu_memory_budget_mb: int | None = None


@dataclass
class Launched:
    """One model's engine as the pool holds it.

    `process` is the engine process this model owns (stopped with it; None when attached
    by URL). `shared` is a process the model runs in without owning it (ComfyUI's server,
    which serves every ComfyUI model): watched for crashes, never stopped with the model;
    `release` then unloads the model from it and answers the MB that freed. `memory_mb`
    is what the launch measured itself (None: the pool measures `process`).
    """

    engine: Engine
    process: EngineProcess | None
    control: httpx.AsyncClient | None = None
    shared: EngineProcess | None = None
    release: Callable[[], Awaitable[int]] | None = None
    memory_mb: int | None = None
    watched: bool = False  # the pool registered its crash callback

    @property
    def watch(self) -> EngineProcess | None:
        """The process whose death ends this model (its own, else the shared one)."""
        return self.process or self.shared

    async def close(self, grace_s: float) -> None:
        self.engine.http.close()
        if self.process is not None:
            await self.process.stop(grace_s)
        if self.control is not None:
            await self.control.aclose()


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
    http = Pool(spec.url, settings.engine_connect_timeout_s, settings.engine_read_timeout_s)
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
) -> Launched:
    """Spawn llama-server for `spec` and wait until it is healthy (EngineStartFailed if not)."""
    model_path = spec.local_path()
    if model_path is None:
        raise ConfigError(f"model {spec.id!r}: backend llama-server needs a path to a GGUF file")
    port = free_port()
    key = new_api_key()
    opts = LaunchOptions(
        binary=spec.bin or settings.llama_server_bin,
        model_path=str(model_path),
        port=port,
        api_key=key,
        slots=spec.slots,
        slot_save_path=tempfile.mkdtemp(prefix=f"quorum-slots-{port}-"),
        ctx_size=params.max_context_length or spec.context_length,
        n_gpu_layers=spec.n_gpu_layers,
        flash_attn=spec.flash_attn,
        embeddings=spec.embeddings,
        pooling=spec.pooling,
        tensor_split=tensor_split,
        extra_args=tuple(spec.args),
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as probe:
        process = EngineProcess(
            name=spec.id,
            argv=command_line(opts),
            health=_health(probe),
            env=env,
            load_timeout_s=spec.load_timeout_s or settings.engine_load_timeout_s,
        )
        await process.start()
    auth = {"Authorization": f"Bearer {key}"}
    control = httpx.AsyncClient(base_url=url, headers=auth, timeout=10.0)
    http = Pool(
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
    )
    return Launched(engine, process, control)
