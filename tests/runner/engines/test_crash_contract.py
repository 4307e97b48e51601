"""The crash contract on every engine kind the runner starts (issue 17's must-show): SIGKILL
of the engine with one request in flight and two queued, `restart` on and off.

llama-server, faster-whisper and vLLM (its CPU build, scripts/install-vllm) are the real
engines; ComfyUI and vLLM also as fakes (tests/fixtures/fake_comfyui.py, fake_vllm.py: a
vLLM on a GPU, and what the CPU build cannot show); a stand-in whose helper child keeps the
engine's output open after it dies (as vLLM's engine core does) makes the runner hear of
the exit late, where a queued request once met the dead engine. The shape is
`tests/support/crash_contract`; a kind is one `CrashKind` here.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.adapters.whisper.speech import speech_files
from tests.fixtures.fake_vllm import BIN as VLLM_BIN
from tests.fixtures.fake_vllm import process_env as vllm_env
from tests.runner.http.audio.runner_kit import transcribe, whisper_models_file, worker_pids
from tests.support import real_engines
from tests.support.crash_contract import CrashKind, run_crash_contract
from tests.support.engines import CHECKPOINT, comfyui_root, processes_with
from tests.support.real_vllm import (
    DEFAULT_ID,
    START_TIMEOUT_S,
    default_entry,
    models_file,
    require_vllm,
)
from tests.support.runner_proc import RunnerProcess, fixture_bin

pytestmark = pytest.mark.timeout(240)

LONG_PROMPT = " ".join(f"word{i}" for i in range(600))  # a minute of the fake's chunks


def _chat(
    url: str, model: str, content: str, tenant: str, timeout: float = 120, **extra: object
) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    headers = {"X-Tenant-ID": tenant}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout)


def _child(runner: RunnerProcess, *parts: str) -> int:
    [(pid, _)] = processes_with(*parts, parent=runner.proc.pid)
    return pid


# -- llama-server (real) ------------------------------------------------------------------


def _llama_models(tmp: Path, restart: bool) -> str:
    gguf = real_engines.llama_server().gemma
    return (
        "models:\n  - id: gemma\n    backend: llama-server\n"
        f"    path: {gguf}\n    context_length: 1024\n    parallel: 1\n"
        f"    preload: true\n    restart: {str(restart).lower()}\n"
    )


def _llama_pid(runner: RunnerProcess) -> int:
    for pid, argv in processes_with(parent=runner.proc.pid):
        if argv and argv[0].endswith("llama-server"):
            return pid
    raise AssertionError("no llama-server under the runner")


def llama_busy(url: str, max_tokens: int = 600) -> httpx.Response:
    """A long stream that keeps the real llama-server's one slot busy."""
    prompt = "Count slowly to two hundred."
    return _chat(url, "gemma", prompt, "busy", max_tokens=max_tokens, stream=True)


LLAMA = CrashKind(
    name="llama-server",
    model="gemma",
    models_file=_llama_models,
    engine_pid=_llama_pid,
    busy=llama_busy,
    quick=lambda url, tenant: _chat(url, "gemma", "hi", tenant, max_tokens=2),
    ready_timeout=120,
    real_engine=True,
)


# -- faster-whisper (real) ----------------------------------------------------------------

_SPEECH: dict[str, Path] = {}


def _whisper_models(tmp: Path, restart: bool) -> str:
    (tmp / "speech").mkdir()
    files = speech_files(tmp / "speech")
    _SPEECH.update(long=files.long, hello=files.hello)
    model = real_engines.whisper_model()
    return whisper_models_file(model, parallel=1, preload=True, restart=restart)


WHISPER = CrashKind(
    name="faster-whisper",
    model="whisper",
    models_file=_whisper_models,
    engine_pid=lambda runner: worker_pids(runner.proc.pid)[0],
    busy=lambda url: transcribe(url, _SPEECH["long"], timeout=120),
    quick=lambda url, tenant: transcribe(
        url, _SPEECH["hello"], headers={"X-Tenant-ID": tenant}, timeout=120
    ),
    env=lambda _tmp: {"WHISPER_CPU_THREADS": "1"},
    real_engine=True,
)


# -- ComfyUI (the fake, started by the runner from COMFYUI_PATH) --------------------------

_COMFY: dict[str, Path] = {}


def _comfy_models(tmp: Path, restart: bool) -> str:
    _COMFY["main"] = comfyui_root(tmp / "ComfyUI", "--slow-step-ms", "300") / "main.py"
    return (
        f"models:\n  - {{id: sd, backend: comfyui, checkpoint: {CHECKPOINT}, preload: true,"
        f" parallel: 1, restart: {str(restart).lower()}}}\n"
    )


def _image(url: str, prompt: str, tenant: str) -> httpx.Response:
    body = {"model": "sd", "prompt": prompt, "size": "64x64"}
    headers = {"X-Tenant-ID": tenant}
    return httpx.post(url + "/v1/images/generations", json=body, headers=headers, timeout=120)


COMFYUI = CrashKind(
    name="comfyui",
    model="sd",
    models_file=_comfy_models,
    engine_pid=lambda runner: _child(runner, str(_COMFY["main"])),
    busy=lambda url: _image(url, "[fake:slow] a slow kite", "busy"),
    quick=lambda url, tenant: _image(url, "a quick kite", tenant),
    env=lambda tmp: {"COMFYUI_PATH": str(tmp / "ComfyUI"), "COMFYUI_CPU": "true"},
)


# -- vLLM (the fake `vllm` executable) -----------------------------------------------------


def _vllm_models(tmp: Path, restart: bool) -> str:
    return (
        f"models:\n  - {{id: m, backend: vllm, hf: org/m, parallel: 1, preload: true,"
        f" restart: {str(restart).lower()}, bin: '{VLLM_BIN}'}}\n"
    )


VLLM = CrashKind(
    name="vllm-fake",
    model="m",
    models_file=_vllm_models,
    engine_pid=lambda runner: _child(runner, "tests.fixtures.fake_vllm"),
    busy=lambda url: _chat(url, "m", LONG_PROMPT, "busy", stream=True),
    quick=lambda url, tenant: _chat(url, "m", "hi", tenant),
    env=lambda _tmp: {
        **vllm_env(CHUNK_DELAY_MS="100"),
        "RUNNER_MEMORY_MB": "81920",
        "VLLM_GPU_MEMORY_UTILIZATION": "0.3",
        "VLLM_MAX_MODEL_LEN": "8192",
    },
)


# -- vLLM (real: the CPU build, the default models file's entry) ----------------------------


def _real_vllm_models(tmp: Path, restart: bool) -> str:
    require_vllm()
    return models_file(default_entry(parallel=1, preload=True, restart=restart))


def _real_vllm_pid(runner: RunnerProcess) -> int:
    for pid, argv in processes_with(parent=runner.proc.pid):
        if "serve" in argv:
            return pid
    raise AssertionError("no vllm serve under the runner")


VLLM_REAL = CrashKind(
    name="vllm",
    model=DEFAULT_ID,
    models_file=_real_vllm_models,
    engine_pid=_real_vllm_pid,
    busy=lambda url: _chat(
        url, DEFAULT_ID, "Count slowly to two hundred.", "busy", max_tokens=600, stream=True
    ),
    quick=lambda url, tenant: _chat(url, DEFAULT_ID, "hi", tenant, timeout=600, max_tokens=2),
    # queued requests wait through vLLM's restart (30 s idle, minutes on a busy machine)
    env=lambda _tmp: {"QUEUE_TIMEOUT_MS": "600000"},
    ready_timeout=START_TIMEOUT_S + 60,
    real_engine=True,
    real_vllm=True,
)


# -- an engine whose helper child keeps its output open (vLLM's engine core does) ----------


def _holds_output_models(tmp: Path, restart: bool) -> str:
    return (
        "models:\n  - id: held\n    backend: llama-server\n    path: /dev/null\n"
        f"    bin: {fixture_bin('llama-server-child-keeps-output')}\n    vram_mb: 64\n"
        f"    parallel: 1\n    preload: true\n    restart: {str(restart).lower()}\n"
    )


HOLDS_OUTPUT = CrashKind(
    name="child-keeps-output",
    model="held",
    models_file=_holds_output_models,
    engine_pid=lambda runner: _child(runner, "tests.fixtures.fake_llama_cli"),
    busy=lambda url: _chat(url, "held", "a long answer", "busy", stream=True),
    quick=lambda url, tenant: _chat(url, "held", "hi", tenant),
)

KINDS = [pytest.param(k, id=k.name) for k in (LLAMA, WHISPER, COMFYUI, VLLM, HOLDS_OUTPUT)] + [
    pytest.param(VLLM_REAL, id=VLLM_REAL.name, marks=pytest.mark.timeout(900))
]


@pytest.mark.parametrize("restart", [True, False], ids=["restart", "no-restart"])
@pytest.mark.parametrize("kind", KINDS)
def test_crash_contract_sigkill_with_one_in_flight_and_two_queued(
    kind: CrashKind, restart: bool, tmp_path: Path
) -> None:
    """SIGKILL of the engine: the request in flight gets 502 engine_crashed naming SIGKILL;
    the two queued are served after the restart (`restart: true`) or get 503
    model_unavailable naming it, with Retry-After (`restart: false`)."""
    run_crash_contract(kind, restart, tmp_path)
