"""The one table from a model's `backend` to its engine kind (adapters/kind.py).

The built-in kinds (`adapters/<kind>/kind.py`) and any that ENGINE_KINDS registers
(`module:attr,...`, each attr a `KindFactory`: called with the engine settings, it
returns an `EngineKind`) are built once per runner; a registered kind of a built-in's
name replaces it. Everything the runner does per kind is asked of the kind found here,
once, by the model's `backend`. Other modules of `runner/` still import concrete kinds:
the speech and image paths their one engine (`WhisperEngine`, `ComfyUIEngine`), the
settings llama-server's and vLLM's default binaries, the metrics vLLM's collector.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from adapters.base import FlushScope
from adapters.comfyui.kind import ComfyUIKind
from adapters.kind import DeclaredPrefix, EngineKind, EngineSettings, EngineSpec, KindFactory
from adapters.launched import Launched
from adapters.llama_server.kind import LlamaServerKind
from adapters.lora import LoraAdapter
from adapters.openai.kind import OpenAIKind
from adapters.vllm.kind import VllmKind
from adapters.whisper.kind import WhisperKind
from runner.errors import ConfigError
from runner.runtime.models_file import PACKAGE_SCHEME, ModelSpec
from runner.runtime.otlp import engine_traces
from runner.runtime.settings import Settings

BUILTIN: tuple[KindFactory, ...] = (LlamaServerKind, VllmKind, OpenAIKind, ComfyUIKind, WhisperKind)


@dataclass(frozen=True, slots=True)
class LoadParams:
    """What a load asks for beyond the models file (the seed's load body)."""

    max_context_length: int | None = None
    quantization: str | None = None
    gpu_memory_budget_mb: int | None = None


def engine_settings(settings: Settings, environ: Mapping[str, str] | None = None) -> EngineSettings:
    """The settings engines are started with; `environ` (default: the process's) says
    where the runner's own spans go (OTEL_*), and with them a started engine's."""
    s = settings
    env = os.environ if environ is None else environ
    return EngineSettings(
        multi_tenant=s.enable_multi_tenant,
        connect_timeout_s=s.engine_connect_timeout_s,
        read_timeout_s=s.engine_read_timeout_s,
        load_timeout_s=s.engine_load_timeout_s,
        hf_home=s.hf_home,
        llama_server_bin=s.llama_server_bin,
        llama_slot_cache_entries=s.llama_slot_cache_entries,
        prefix_cache_dir=s.prefix_cache_dir,
        prefix_cache_persist=s.prefix_cache_persist,
        prefix_cache_max_mb=s.prefix_cache_max_mb,
        prefix_cache_ttl_s=s.prefix_cache_ttl_s,
        vllm_bin=s.vllm_bin,
        vllm_max_model_len=s.vllm_max_model_len,
        vllm_gpu_memory_utilization=s.vllm_gpu_memory_utilization,
        vllm_enable_prefix_caching=s.vllm_enable_prefix_caching,
        vllm_enable_sleep_mode=s.vllm_enable_sleep_mode,
        vllm_cache_salt_secret=s.vllm_cache_salt_secret,
        vllm_model_info_dir=s.vllm_model_info_dir,
        otlp_traces=engine_traces(env, s.engine_traces),
        comfyui_path=s.comfyui_path,
        comfyui_python=s.comfyui_python,
        comfyui_cpu=s.comfyui_cpu,
        comfyui_image_metadata=s.comfyui_image_metadata,
        whisper_device=s.whisper_device,
        whisper_compute_type=s.whisper_compute_type,
        whisper_cpu_threads=s.whisper_cpu_threads,
        whisper_load_timeout_s=s.whisper_load_timeout_s,
        whisper_allow_download=s.whisper_allow_download,
    )


def registered(text: str) -> list[KindFactory]:
    """The factories ENGINE_KINDS names (`module:attr`, comma-separated); a ConfigError
    naming the entry that cannot be imported or is not callable."""
    factories: list[KindFactory] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        module, sep, attr = entry.partition(":")
        if not (module and sep and attr):
            raise ConfigError(f"ENGINE_KINDS={text!r}: {entry!r} is not module:attr")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"ENGINE_KINDS={text!r}: {entry!r}: {exc}") from None
        if not callable(factory):
            raise ConfigError(f"ENGINE_KINDS={text!r}: {entry!r} is not a kind factory")
        factories.append(factory)
    return factories


class EngineKinds:
    """The runner's engine kinds, by name."""

    def __init__(
        self, settings: EngineSettings | None = None, extra: Sequence[KindFactory] = ()
    ) -> None:
        built = [make(settings or EngineSettings()) for make in (*BUILTIN, *extra)]
        self._by_name: dict[str, EngineKind] = {kind.name: kind for kind in built}

    @classmethod
    def from_settings(cls, settings: Settings) -> EngineKinds:
        return cls(engine_settings(settings), registered(settings.engine_kinds))

    def __iter__(self) -> Iterator[EngineKind]:
        return iter(self._by_name.values())

    def named(self, backend: str) -> EngineKind:
        """The kind called `backend` (ConfigError when no kind is)."""
        kind = self._by_name.get(backend)
        if kind is None:
            supported = ", ".join(sorted(self._by_name))
            raise ConfigError(
                f"backend {backend!r} is not available in this version (supported: {supported})"
            )
        return kind

    def of(self, spec: ModelSpec) -> EngineKind:
        """The kind of `spec` (ConfigError naming the model for a backend no kind serves)."""
        try:
            return self.named(spec.backend)
        except ConfigError as exc:
            raise ConfigError(f"model {spec.id!r}: {exc}") from None

    def slots(self, spec: ModelSpec) -> int:
        """Requests `spec` may have in flight at its engine: `parallel`, else its kind's."""
        return spec.parallel or self.of(spec).traits.default_parallel

    def engine_spec(
        self,
        spec: ModelSpec,
        params: LoadParams | None = None,
        adapters: Sequence[LoraAdapter] = (),
    ) -> EngineSpec:
        """`spec`'s engine fields for its kind, with what a load asks for (`params`) and
        the LoRA adapters a start serves from the outset (`adapters`)."""
        p = params or LoadParams()
        path = spec.local_path()
        problem = None
        if spec.path and path is None:
            package = spec.path.removeprefix(PACKAGE_SCHEME).partition("/")[0]
            problem = f"Python package {package!r} is not installed (scripts/install)"
        return EngineSpec(
            model_id=spec.id,
            backend=spec.backend,
            slots=self.slots(spec),
            url=spec.url,
            path=path,
            path_text=spec.path,
            path_problem=problem,
            hf=spec.hf,
            vram_mb=spec.vram_mb,
            context_length=p.max_context_length or spec.context_length,
            quantization=p.quantization or spec.quantization,
            gpu_memory_budget_mb=p.gpu_memory_budget_mb,
            load_timeout_s=spec.load_timeout_s,
            args=tuple(spec.args),
            parallel=spec.parallel,
            isolate_tenants=spec.isolate_tenants,
            shared_cache=spec.shared_cache,
            embeddings=spec.embeddings,
            pooling=spec.pooling,
            swa_full=spec.swa_full,
            n_gpu_layers=spec.n_gpu_layers,
            flash_attn=spec.flash_attn,
            gpus=tuple(spec.gpus) if spec.gpus is not None else None,
            bin=os.path.expanduser(spec.bin) if spec.bin else None,
            workflow=spec.workflow,
            checkpoint=spec.checkpoint,
            whisper_model=spec.whisper_model,
            adapters=tuple(adapters),
            max_adapters=spec.max_adapters,
            adapter_room=spec.adapter_capacity,
            public_prefixes=tuple(
                DeclaredPrefix(p.name, p.system, p.prompt) for p in spec.public_prefixes
            ),
        )

    def check(self, spec: ModelSpec) -> None:
        """Refuse an entry of the models file its kind cannot serve (ConfigError naming why).

        1. Its backend names a kind of this runner.
        2. A field only some kinds read is set for those only.
        3. Its kind's own checks (`EngineKind.check`).
        """
        kind = self.of(spec)  # 1
        for name in sorted({f for k in self for f in k.traits.own_fields}):  # 2
            owners = sorted(k.name for k in self if name in k.traits.own_fields)
            if getattr(spec, name, None) and kind.name not in owners:
                raise ConfigError(
                    f"model {spec.id!r}: {name} applies to backend "
                    f"{' or '.join(repr(o) for o in owners)} only"
                )
        try:
            kind.check(self.engine_spec(spec))  # 3
        except ValueError as exc:
            raise ConfigError(f"model {spec.id!r}: {exc}") from None

    def default_backend(self, models: Sequence[ModelSpec]) -> str:
        """The backend of a governed load naming a model the models file does not (a path
        or a Hugging Face repository): among the kinds that load such models
        (`Traits.catalog_rank`), the first the file starts models of, else the first."""
        ranked = sorted(
            (k for k in self if k.traits.catalog_rank is not None),
            key=lambda k: k.traits.catalog_rank or 0,
        )
        if not ranked:
            raise ConfigError("no engine kind loads a model by its path")
        started = {m.backend for m in models if not m.attached}
        return next((k.name for k in ranked if k.name in started), ranked[0].name)

    def flush_at_rest(self, scope: FlushScope, running: Sequence[Launched]) -> int:
        """Remove the state in `scope` each kind keeps for engines not running (saved
        prompt states), leaving `running` engines' own; how many entries were in scope."""
        return sum(kind.flush_at_rest(scope, running) for kind in self)

    def pids(self) -> list[int]:
        """Engine processes no model owns (a kind's shared server)."""
        return [pid for kind in self for pid in kind.pids()]

    async def close(self) -> None:
        for kind in self:
            await kind.close()
