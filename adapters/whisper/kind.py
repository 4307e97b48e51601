"""faster-whisper as an engine kind: a speech worker process per model, on the audio path.

- Started (`start`): `python -m adapters.whisper.worker` for the model's CTranslate2
  directory, Hugging Face repo or size name (`whisper_model_arg`); ready once it sent
  `Ready` over its private socket. One process per model: CTranslate2 returns its memory
  only when the process ends, and a crash inside it must not take the runner down.
  `parallel` is CTranslate2's `num_workers`. Never attached by URL.
- Not probed over HTTP: the worker's socket tells when it dies, and a transcription it
  stays silent on for ENGINE_READ_TIMEOUT_S has it killed (`engine.py`).
- Sized by its weights (`speech_worker_mb`); placed on GPUs only with WHISPER_DEVICE
  other than `cpu`; nothing a cache flush addresses.
"""

from __future__ import annotations

from adapters.features import Features
from adapters.kind import Devices, EngineSettings, EngineSpec, Host, KindDefaults, Traits
from adapters.launched import Launched
from adapters.whisper.engine import WHISPER_ENVIRONMENT, WhisperEngine
from adapters.whisper.settings import WhisperOptions, WhisperSettings
from faults import ConfigError

NAME = "faster-whisper"

WHISPER_SIZES: tuple[str, ...] = (
    "tiny.en",
    "tiny",
    "base.en",
    "base",
    "small.en",
    "small",
    "medium.en",
    "medium",
    "large-v1",
    "large-v2",
    "large-v3",
    "large",
    "distil-large-v2",
    "distil-medium.en",
    "distil-small.en",
    "distil-large-v3",
    "distil-large-v3.5",
    "large-v3-turbo",
    "turbo",
)
"""faster-whisper's size names (`faster_whisper.utils._MODELS`), found in the HF cache."""

# Whisper model.bin sizes (float16 CTranslate2 conversions), for sizes not on disk yet.
WHISPER_WEIGHTS_MB = {"tiny": 75, "base": 145, "small": 484, "medium": 1530, "large": 3090}
WHISPER_RUNTIME_MB = 256
"""A speech worker's own: Python, CTranslate2, PyAV, the decoder's buffers."""


def speech_worker_mb(size_bytes: int | None, whisper_model: str | None) -> int | None:
    """A faster-whisper worker's memory, or None when nothing tells (the chain applies).

    CTranslate2 weights (`model.bin`) carry no GGUF/safetensors suffix, so the file rule
    of the chain does not fire for them and its default (8 GB) would be far off.

    1. Weights on disk (`size_bytes`) -> their MiB.
    2. Else a size name (`tiny.en`, `distil-large-v3`, `turbo`) -> its family's weights.
    3. Neither -> None.
    Then weights x 1.5 (int8/float16 conversion, decoder state) + WHISPER_RUNTIME_MB.
    """
    weights_mb: float | None = None
    if size_bytes:  # 1
        weights_mb = size_bytes / 2**20
    elif whisper_model is not None:  # 2
        family = whisper_model.removeprefix("distil-").split(".")[0].split("-")[0]
        weights_mb = WHISPER_WEIGHTS_MB.get("large" if family == "turbo" else family)
    if weights_mb is None:  # 3
        return None
    return round(weights_mb * 1.5) + WHISPER_RUNTIME_MB


def whisper_model_arg(spec: EngineSpec) -> str:
    """What the speech worker loads: a CTranslate2 directory, an HF repo id, or a size name.

    A path that does not resolve (a `package:` whose package is not installed) is a
    ConfigError naming it.
    """
    size = WhisperOptions.of(spec.options).whisper_model
    if size is not None:
        return size
    if spec.hf is not None:
        return spec.hf
    if spec.path is None:
        raise ConfigError(
            f"model {spec.model_id!r}: path {spec.path_text!r}: {spec.path_problem or 'none'}"
        )
    return str(spec.path)


class WhisperKind(KindDefaults):
    name = NAME
    traits = Traits(
        request_path="audio",
        default_parallel=1,
        probe_path=None,
        options=WhisperOptions,
        flush=False,
        environment=WHISPER_ENVIRONMENT,
        error_tables=("adapters.whisper.errors",),
    )

    def __init__(self, settings: EngineSettings) -> None:
        super().__init__(settings)
        self.own = WhisperSettings.read(settings.environ)

    def check(self, spec: EngineSpec) -> None:
        """Started by the runner (no url), from exactly one of `path`, `hf`,
        `whisper_model` (a size name faster-whisper knows)."""
        if spec.url:
            raise ValueError("backend 'faster-whisper' is started by the runner: no url")
        size = WhisperOptions.of(spec.options).whisper_model
        given = [f for f in (spec.path_text, spec.hf, size) if f]
        if len(given) != 1:
            raise ValueError("backend 'faster-whisper' needs one of path, hf, whisper_model")
        if size is not None and size not in WHISPER_SIZES:
            raise ValueError(f"whisper_model must be one of {', '.join(WHISPER_SIZES)}")

    def features(self, spec: EngineSpec) -> Features:
        return Features(audio_input=True)

    def estimate_mb(self, spec: EngineSpec, size_bytes: int | None) -> int | None:
        return speech_worker_mb(size_bytes, WhisperOptions.of(spec.options).whisper_model)

    def placed(self, spec: EngineSpec) -> bool:
        return self.own.device != "cpu"

    async def start(self, spec: EngineSpec, devices: Devices, host: Host) -> Launched:
        """Spawn the speech worker for `spec`; wait for its Ready (EngineStartFailed if
        not). A worker silent on a transcription for ENGINE_READ_TIMEOUT_S is killed."""
        s = self.settings
        env = dict(devices.env)
        if s.hf_home:
            env["HF_HOME"] = s.hf_home
        engine = WhisperEngine(
            spec.model_id,
            whisper_model_arg(spec),
            device=self.own.device,
            compute_type=self.own.compute_type,
            parallel=spec.slots,
            cpu_threads=self.own.cpu_threads,
            load_timeout_s=spec.load_timeout_s or self.own.load_timeout_s,
            allow_download=self.own.allow_download,
            env=env,
            silence_s=s.read_timeout_s,
        )
        await engine.start()
        return Launched(engine, engine.process, speech=engine)
