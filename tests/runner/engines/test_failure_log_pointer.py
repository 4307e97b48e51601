"""A failed start names where its log is, and that place answers (docs/reliability.md,
section 2): `GET /v1/models/{model}/logs` for the model that failed, also for the engines
whose process has a name of its own (a speech worker `whisper:<id>`, the ComfyUI server).
llama-server and faster-whisper are the real engines, ComfyUI the fake."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import real_engines
from tests.support.engines import CHECKPOINT, caps, comfyui_root
from tests.support.runner_proc import start_runner, wait_started
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(90)


def _broken_whisper(tmp: Path) -> tuple[str, dict[str, str]]:
    folder = tmp / "not-a-model"
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"\0" * 64)
    return f"models:\n  - {{id: w, backend: faster-whisper, path: '{folder}', preload: true}}\n", {
        "WHISPER_CPU_THREADS": "1"
    }


def _broken_llama(tmp: Path) -> tuple[str, dict[str, str]]:
    real_engines.llama_server()  # the real binary, which the runner finds by default
    gguf = tmp / "broken.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 4096)  # the real llama-server exits on it
    return f"models:\n  - {{id: w, backend: llama-server, path: '{gguf}', preload: true}}\n", {}


def _broken_comfyui(tmp: Path) -> tuple[str, dict[str, str]]:
    root = comfyui_root(tmp / "ComfyUI", "--no-such-flag")  # the server exits at start
    models = f"models:\n  - {{id: w, backend: comfyui, checkpoint: {CHECKPOINT}, preload: true}}\n"
    return models, {"COMFYUI_PATH": str(root), "COMFYUI_CPU": "true"}


@dataclass(frozen=True)
class Broken:
    """A models file (and env) whose one model fails to start; `real_engine`: the real
    llama-server's (tests/conftest.py marks the test)."""

    make: Callable[[Path], tuple[str, dict[str, str]]]
    real_engine: bool = False


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(Broken(_broken_llama, real_engine=True), id="llama"),
        pytest.param(Broken(_broken_whisper), id="whisper"),
        pytest.param(Broken(_broken_comfyui), id="comfyui"),
    ],
)
def test_failed_start_points_at_the_models_own_logs(broken: Broken, tmp_path: Path) -> None:
    """The model's failure names `GET /v1/models/w/logs`, which answers admins with the
    engine's output (and nothing else names a path that does not exist)."""
    models, env = broken.make(tmp_path)
    with start_runner(models_file=models, env={**env, **gateway_env()}, wait_ready=False) as runner:
        wait_started(runner, 60)
        [failed] = caps(runner.url)["models"]["failed"]
        assert failed["id"] == "w" and "GET /v1/models/w/logs (admins)" in failed["error"], failed
        logs = httpx.get(runner.url + "/v1/models/w/logs", headers={FAIRNESS: "ops"})
        assert logs.status_code == 200 and logs.json()["lines"], logs.text
