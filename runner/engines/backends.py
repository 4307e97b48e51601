"""Which backend starts which model: the pool asks `Launcher.launch`, whatever the engine.

    backend        started by the runner (path / hf / nothing)      attached (url)
    llama-server   launch.start_llama_server                        launch.attach
    vllm           vllm.start_vllm                                  vllm.attach_vllm
    comfyui        comfyui.start_comfyui (spawned server)           comfyui.start_comfyui
    faster-whisper launch.start_whisper (a worker process per model) -
    openai         -                                                launch.attach

The launcher also holds what the engines of one kind share for the runner's lifetime: the
cache-salt secret and each vLLM model's salts (kept across reloads and sleep, so a flush's
rotation is never undone by a reload), the collector that re-exposes vLLM's metrics, and
the ComfyUI servers.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from adapters.llama_server.prefix_store import Bounds, PrefixCache
from adapters.lora import LoraAdapter
from adapters.vllm.engine import CacheSalts, VllmMetricsCollector
from faults import QuorumError
from runner.engines.comfyui import ComfyUIServers, start_comfyui
from runner.engines.launch import Launched, LoadParams, attach, start_llama_server, start_whisper
from runner.engines.vllm import attach_vllm, start_vllm
from runner.errors import ServiceUnavailable
from runner.memory.telemetry import Telemetry
from runner.runtime.models_file import ModelSpec
from runner.runtime.settings import Settings


class Launcher:
    def __init__(
        self,
        settings: Settings,
        telemetry: Telemetry,
        *,
        multi_tenant: bool,
        vllm_metrics: VllmMetricsCollector | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.multi_tenant = multi_tenant
        self.vllm_metrics = vllm_metrics
        secret = settings.vllm_cache_salt_secret
        self._secret = secret.encode() if secret else secrets.token_bytes(32)
        self._salts: dict[str, CacheSalts] = {}
        self.comfyui = ComfyUIServers(settings)
        root = Path(settings.prefix_cache_dir).expanduser()
        self.prefixes = PrefixCache(
            root if settings.prefix_cache_persist else None,
            Bounds(
                settings.prefix_cache_max_mb * 2**20,
                settings.llama_slot_cache_entries,
                settings.prefix_cache_ttl_s,
            ),
        )

    async def launch(
        self,
        spec: ModelSpec,
        params: LoadParams,
        env: Mapping[str, str],
        *,
        tensor_split: str | None = None,
        adapters: Sequence[LoraAdapter] = (),
    ) -> Launched:
        """Start or attach `spec`'s engine; ready to serve when this returns. `env` holds the
        GPUs the pool placed it on; `tensor_split` is llama-server's split across them;
        `adapters` the LoRA adapters it serves from start."""
        s = self.settings
        if spec.backend == "comfyui":
            return await start_comfyui(spec, self.comfyui)
        if spec.backend == "vllm":
            salts = self.salts(spec)
            if spec.attached:
                return attach_vllm(spec, s, salts=salts, metrics=self.vllm_metrics)
            total = self.gpu_total_mb(spec) if params.gpu_memory_budget_mb else None
            return await start_vllm(
                spec,
                params,
                s,
                env,
                salts=salts,
                gpu_total_mb=total,
                metrics=self.vllm_metrics,
                measure=self.measure,
                adapters=adapters,
            )
        if spec.backend == "faster-whisper":
            return await start_whisper(spec, s, env)
        if spec.attached:
            return await attach(spec, s, self.multi_tenant)
        if spec.backend == "llama-server":
            return await start_llama_server(
                spec,
                params,
                s,
                env,
                self.multi_tenant,
                tensor_split=tensor_split,
                prefixes=self.prefixes,
                adapters=adapters,
            )
        raise ServiceUnavailable(f"backend {spec.backend!r} cannot be started by this runner")

    def salts(self, spec: ModelSpec) -> CacheSalts | None:
        """The model's cache salts; None when its tenants may share vLLM's prefix cache."""
        if not (self.multi_tenant and spec.isolate_tenants):
            return None
        if spec.id not in self._salts:
            self._salts[spec.id] = CacheSalts(self._secret)
        return self._salts[spec.id]

    def gpu_total_mb(self, spec: ModelSpec) -> int | None:
        """The total memory of the GPU `spec` runs on (its first listed, else the first
        visible; the budget pseudo-device without a GPU); None when telemetry fails."""
        try:
            snapshot = self.telemetry.snapshot()
            gpu = snapshot.gpu(spec.gpus[0]) if spec.gpus else snapshot.gpus[0]
        except (QuorumError, KeyError, IndexError):
            return None
        return gpu.total_mb

    async def measure(self, pid: int) -> int:
        return await asyncio.to_thread(self.telemetry.process_used_mb, [pid])

    def pids(self) -> list[int]:
        """Engine processes no model owns (ComfyUI's server)."""
        return self.comfyui.pids()

    async def close(self) -> None:
        await self.comfyui.close()
