"""What an engine kind is: the one interface every kind implements, and the data it gets.

A kind is one place (`adapters/<kind>/kind.py`): how its engines are started or attached
(`start`, `attach`), probed (`Traits.probe_path`), sized (`estimate_mb`, `memory_share`,
`slot_group`), what they report (`Launched.load`, `Launched.version`, `Traits.version`),
what they can do (the facets of `Launched`, adapters/launched.py: sleep, flush, KV
figures, LoRA adapters; `adapter_room`, `flush_at_rest`), which request
path serves them (`Traits.request_path`), what they offer clients (`features`), which
request fields beyond OpenAI's they take (`Traits.request_fields`), how a
models-file entry of the kind is checked (`check`), which files a download fetches
(`Traits.download_patterns`). The runner looks a model's kind up once, by its `backend`,
in one table (`runner/engines/kinds.py`), and asks the kind; it never names one.

The runner builds a kind once per runner from `EngineSettings` (`KindFactory`), hands it
an `EngineSpec` (a model's engine-facing fields, plain frozen data) and, to start one, a
`Host` (what the runner lends: measuring a process, the GPU's size, the engine metric
families). `KindDefaults` gives a kind that declares nothing special its answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from prometheus_client.metrics_core import Metric

from adapters.base import FlushScope
from adapters.features import NONE, Features
from adapters.fields import OPENAI_ONLY, RequestFields
from adapters.launched import Launched
from adapters.lora import LoraAdapter
from faults import ServiceUnavailable

RequestPath = Literal["chat", "audio", "images"]
"""The request path that serves a kind's models: chat (`/v1/chat/completions`,
`/v1/completions`, `/v1/embeddings`), audio (`/v1/audio/*`), images
(`/v1/images/generations`)."""


@dataclass(frozen=True, slots=True)
class DeclaredPrefix:
    """A public prefix the models file declares (`public_prefixes`): a chat's system
    message (`system`) or a completion's prompt (`prompt`) every tenant may share the
    cached state of."""

    name: str
    system: str | None = None
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """One model's engine as its kind sees it: the models-file entry's engine fields, and
    what a load asks for beyond them (`context_length`, `quantization`: the load's, else
    the entry's; `gpu_memory_budget_mb`). `path` is the model's files on disk (None: none
    given, or `path_problem` says why it does not resolve). `adapters` are the LoRA
    adapters a start serves from the outset (their files checked), `adapter_room` the
    entry's room for them (`max_adapters`, else those declared)."""

    model_id: str
    backend: str
    slots: int
    url: str | None = None
    path: Path | None = None
    path_text: str | None = None  # `path` as the models file wrote it
    path_problem: str | None = None
    hf: str | None = None
    vram_mb: int | None = None
    context_length: int | None = None
    quantization: str | None = None
    gpu_memory_budget_mb: int | None = None
    load_timeout_s: float | None = None
    args: tuple[str, ...] = ()
    parallel: int | None = None  # the entry's `parallel` (None: the kind's default)
    isolate_tenants: bool = True  # neither `single_tenant` nor `shared_cache`
    shared_cache: bool = False
    embeddings: bool = False
    pooling: str | None = None
    swa_full: bool = True
    n_gpu_layers: int | None = None
    flash_attn: str | None = None
    gpus: tuple[int, ...] | None = None
    bin: str | None = None
    workflow: str | None = None
    checkpoint: str | None = None
    whisper_model: str | None = None
    adapters: tuple[LoraAdapter, ...] = ()
    max_adapters: int | None = None
    adapter_room: int = 0
    public_prefixes: tuple[DeclaredPrefix, ...] = ()

    @property
    def attached(self) -> bool:
        """An engine somebody else runs, reached at `url`."""
        return self.url is not None

    def executable(self, default: str) -> str:
        """The engine's executable: `bin`, else `default`."""
        return self.bin or default


@dataclass(frozen=True, slots=True)
class OtlpTraces:
    """Where an engine that exports OpenTelemetry spans sends them (the runner's own
    collector, runner/runtime/otlp.py): the endpoint as its exporter is handed it, OTLP's
    protocol (`http/protobuf` or `grpc`), the service name its spans carry."""

    endpoint: str
    protocol: str
    service_name: str


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The runner's settings that engines are started with (from `Settings`)."""

    multi_tenant: bool = True
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    load_timeout_s: float = 300.0
    hf_home: str | None = None
    llama_server_bin: str = "llama-server"
    llama_slot_cache_entries: int = 64
    prefix_cache_dir: str | None = None  # None: saved prompt states die with their engine
    prefix_cache_persist: bool = True
    prefix_cache_max_mb: int = 2048
    prefix_cache_ttl_s: float = 86_400.0
    vllm_bin: str = "vllm"
    vllm_max_model_len: int | None = None
    vllm_gpu_memory_utilization: float = 0.9
    vllm_enable_prefix_caching: bool = True
    vllm_enable_sleep_mode: bool = False
    vllm_cache_salt_secret: str | None = None
    vllm_model_info_dir: str | None = None  # None: vLLM inspects the model class at every start
    otlp_traces: OtlpTraces | None = None  # None: started engines export no spans
    comfyui_path: str | None = None
    comfyui_python: str | None = None
    comfyui_cpu: bool = False
    comfyui_image_metadata: bool = False
    whisper_device: str = "cpu"
    whisper_compute_type: str = "int8"
    whisper_cpu_threads: int = 0
    whisper_load_timeout_s: float = 120.0
    whisper_allow_download: bool = False


@dataclass(frozen=True, slots=True)
class LoadGuess:
    """How fast a first load of the kind is guessed to be (until one is measured): a fixed
    start plus the weights over a bandwidth."""

    start_s: float
    bandwidth_mb_s: float


@dataclass(frozen=True, slots=True)
class Traits:
    """What a kind declares once, for all its engines."""

    request_path: RequestPath = "chat"
    default_parallel: int = 1  # requests in flight at once when the entry sets no `parallel`
    probe_path: str | None = None  # asked to tell whether an engine is there; None: never
    # probed (its own channel tells: the speech worker's socket)
    own_fields: frozenset[str] = frozenset()  # models-file fields only this kind reads
    kv_cache: bool = False  # the memory beyond its weights is a KV cache (else "other")
    reports_kv: bool = False  # its engines report their KV figures themselves (`load`)
    flush: bool = True  # a cache flush addresses its engines (else: not in any scope)
    load_guess: LoadGuess | None = None  # the load-time estimate's guess before a first load
    catalog_rank: int | None = None  # loads a model named by a path or a Hugging Face repo:
    # the lowest rank among the kinds the models file starts wins (None: never)
    download_patterns: tuple[str, ...] | None = None  # the files a download fetches (all)
    version: str | None = None  # the engine's version, when known without asking one
    adapters: bool = False  # its started engines serve LoRA adapters (`adapter_room`)
    request_fields: RequestFields = OPENAI_ONLY  # the body fields its engines take beyond
    # OpenAI's on the chat path, and how each counts (adapters/fields.py)
    environment: tuple[str, ...] = ()  # the runner's environment names its engines get
    # beyond adapters/environment.py's COMMON (`NAME`, or `PREFIX*`); nothing else


class EngineFamilies(Protocol):
    """Where engines hand the metric families they expose themselves (vLLM's `/metrics`),
    re-exposed by the runner for the endpoint picker (adapters/vllm/metrics.py)."""

    def update(self, engine_id: str, families: list[Metric]) -> None: ...

    def forget(self, engine_id: str) -> None: ...

    def engines(self) -> list[str]: ...


class Host(Protocol):
    """What the runner lends a kind to start its engines."""

    @property
    def families(self) -> EngineFamilies:
        """Where engines re-expose their own metric families."""
        ...

    async def measure_mb(self, pid: int) -> int:
        """MiB a process and its children hold (GPU memory with NVML, else resident)."""
        ...

    def gpu_total_mb(self, gpus: Sequence[int] | None) -> int | None:
        """The total memory of the first of `gpus` (None: the first visible); None when
        telemetry fails."""
        ...


@dataclass(frozen=True, slots=True)
class Devices:
    """Where the pool placed an engine it starts: `env` (CUDA_VISIBLE_DEVICES, ...), and
    `tensor_split`, the shares of a model split across several GPUs."""

    env: Mapping[str, str] = field(default_factory=dict)
    tensor_split: str | None = None


class EngineKind(Protocol):
    """One engine kind, built once per runner (`KindFactory`); see the module docstring."""

    name: str  # the models file's `backend`
    traits: Traits

    def check(self, spec: EngineSpec) -> None:
        """Refuse a models-file entry the kind cannot serve (ValueError naming why)."""
        ...

    def features(self, spec: EngineSpec) -> Features:
        """What a loaded engine of `spec` offers its clients (`/v1/capabilities`)."""
        ...

    def slot_group(self, spec: EngineSpec) -> str | None:
        """The engine process `spec` shares with other models (their slots are one pool:
        runner/scheduler/slot_groups.py); None: its own."""
        ...

    def sleep_refusal(self, spec: EngineSpec, on_gpu: bool) -> str | None:
        """Why an unload may not put `spec` to sleep; None when it may."""
        ...

    def memory_share(self, spec: EngineSpec) -> float | None:
        """The share of its GPU an engine takes whatever its weights weigh (its estimate
        when no budget is given); None: estimated from its files."""
        ...

    def estimate_mb(self, spec: EngineSpec, size_bytes: int | None) -> int | None:
        """The kind's own memory estimate for `spec` (its files weigh `size_bytes`); None:
        the runner's chain applies (seed 000)."""
        ...

    def placed(self, spec: EngineSpec) -> bool:
        """Whether a started engine of `spec` is placed on GPUs."""
        ...

    def adapter_room(self, spec: EngineSpec) -> int | None:
        """How many LoRA adapters an engine of `spec` may hold (a governed adapter load is
        refused past it); None: no bound."""
        ...

    def flush_at_rest(self, scope: FlushScope, running: Sequence[Launched]) -> int:
        """Remove the state in `scope` the kind keeps for engines not running (saved
        prompt states), not that of `running` engines (they flush their own); how many
        entries were in scope. Blocking file work: called in a thread."""
        ...

    def model_file(self, directory: Path, quantization: str | None) -> Path | None:
        """The path the kind loads for a model found in `directory` (None: none there)."""
        ...

    def downloads_first(self, spec: EngineSpec) -> bool:
        """Whether the runner downloads `spec`'s repository before a start (the engine
        cannot fetch it itself)."""
        ...

    async def start(self, spec: EngineSpec, devices: Devices, host: Host) -> Launched:
        """Start an engine for `spec`; ready to serve when this returns."""
        ...

    async def attach(self, spec: EngineSpec, host: Host) -> Launched:
        """An engine somebody else runs, at `spec.url`."""
        ...

    def pids(self) -> list[int]:
        """Engine processes of the kind no model owns (a shared server)."""
        ...

    async def close(self) -> None:
        """The runner stops: what the kind's engines share is stopped too."""
        ...


CANNOT_SLEEP = "mode 'sleep' needs a vLLM model the runner started"
"""Why an unload may not put a model to sleep, for every kind but vLLM started here."""

KindFactory = Callable[[EngineSettings], EngineKind]
"""How a kind is registered (`ENGINE_KINDS=module:attr`): called once per runner."""


class KindDefaults:
    """The answers of a kind that declares nothing special (subclass and override)."""

    name: str = ""
    traits: Traits = Traits()

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings

    def check(self, spec: EngineSpec) -> None:
        if spec.url and spec.path_text:
            raise ValueError("give either url (attach a running engine) or path, not both")

    def features(self, spec: EngineSpec) -> Features:
        return NONE

    def slot_group(self, spec: EngineSpec) -> str | None:
        return None

    def sleep_refusal(self, spec: EngineSpec, on_gpu: bool) -> str | None:
        return CANNOT_SLEEP

    def memory_share(self, spec: EngineSpec) -> float | None:
        return None

    def estimate_mb(self, spec: EngineSpec, size_bytes: int | None) -> int | None:
        return None

    def placed(self, spec: EngineSpec) -> bool:
        return True

    def adapter_room(self, spec: EngineSpec) -> int | None:
        return spec.max_adapters

    def flush_at_rest(self, scope: FlushScope, running: Sequence[Launched]) -> int:
        return 0

    def model_file(self, directory: Path, quantization: str | None) -> Path | None:
        return directory

    def downloads_first(self, spec: EngineSpec) -> bool:
        return False

    async def start(self, spec: EngineSpec, devices: Devices, host: Host) -> Launched:
        raise ServiceUnavailable(f"backend {self.name!r} cannot be started by this runner")

    async def attach(self, spec: EngineSpec, host: Host) -> Launched:
        raise ServiceUnavailable(f"backend {self.name!r} cannot be attached by URL")

    def pids(self) -> list[int]:
        return []

    async def close(self) -> None:
        return None
