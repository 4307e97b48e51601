"""Async jobs whose engine is killed (docs/reliability.md, section 3): the running job ends
`failed` with `engine_crashed` naming the signal, the one queued behind it `failed` with
`model_unavailable` (no `restart`), and both count in `quorum_jobs_total`. ComfyUI runs the
fake (started by the runner from COMFYUI_PATH); faster-whisper the real worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.adapters.whisper.speech import speech_files
from tests.runner.http.audio.runner_kit import metric, transcribe, whisper_models_file, worker_pids
from tests.support.engines import CHECKPOINT, comfyui_root, processes_with
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner, wait_started

pytestmark = pytest.mark.timeout(120)

ASYNC = {"X-Tenant-ID": "jobs", "Prefer": "respond-async"}
ENDED = ("succeeded", "failed", "cancelled")


def _job(url: str, job_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{url}/v1/jobs/{job_id}", headers=ASYNC, timeout=10).json()
    return doc


def _kill_under_jobs(
    runner: RunnerProcess, submit: Callable[[str], httpx.Response], engine_pid: int, kind: str
) -> None:
    """A slow job running and a quick one queued behind it; SIGKILL of the engine."""
    url = runner.url
    running = submit("slow")
    queued = submit("quick")
    assert running.status_code == queued.status_code == 202, (running.text, queued.text)
    first, second = running.json()["id"], queued.json()["id"]
    eventually(lambda: _job(url, first)["status"] == "running", 60, "the first job running")
    os.kill(engine_pid, signal.SIGKILL)
    crashed = eventually(lambda: (d := _job(url, first))["status"] in ENDED and d, 60, "end")
    assert crashed["status"] == "failed", crashed
    assert crashed["error"]["code"] == "engine_crashed" and "SIGKILL" in crashed["error"]["message"]
    refused = eventually(lambda: (d := _job(url, second))["status"] in ENDED and d, 60, "end")
    assert refused["status"] == "failed", refused
    assert refused["error"]["code"] == "model_unavailable", refused
    assert metric(url, "quorum_jobs_total", kind=kind, outcome="failed") == 2


def test_job_crash_comfyui_running_job_engine_crashed_queued_unavailable(tmp_path: Path) -> None:
    """ComfyUI (fake) killed under a running image job, another queued behind it."""
    main = comfyui_root(tmp_path / "ComfyUI", "--slow-step-ms", "300") / "main.py"
    models = (
        f"models:\n  - {{id: sd, backend: comfyui, checkpoint: {CHECKPOINT}, preload: true,"
        " parallel: 1}\n"
    )
    env = {"COMFYUI_PATH": str(tmp_path / "ComfyUI"), "COMFYUI_CPU": "true"}
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        [(pid, _)] = processes_with(str(main), parent=runner.proc.pid)

        def submit(which: str) -> httpx.Response:
            prompt = "[fake:slow] a slow kite" if which == "slow" else "a quick kite"
            body = {"model": "sd", "prompt": prompt, "size": "64x64"}
            return httpx.post(
                runner.url + "/v1/images/generations", json=body, headers=ASYNC, timeout=30
            )

        _kill_under_jobs(runner, submit, pid, "image_generation")


def test_job_crash_whisper_running_job_engine_crashed_queued_unavailable(
    whisper_model: str, tmp_path: Path
) -> None:
    """The real speech worker killed under a running transcription job, another queued."""
    files = speech_files(tmp_path)
    models = whisper_models_file(whisper_model, parallel=1, preload=True, restart=False)
    env = {"WHISPER_CPU_THREADS": "1"}
    with start_runner(models_file=models, env=env, wait_ready=False) as runner:
        wait_started(runner, 60)
        eventually(lambda: worker_pids(runner.proc.pid), 60, "the speech worker")
        eventually(
            lambda: httpx.get(runner.url + "/health", timeout=10).status_code == 200,
            60,
            "the model loaded",
        )

        def submit(which: str) -> httpx.Response:
            audio = files.long if which == "slow" else files.hello
            return transcribe(runner.url, audio, headers=ASYNC, timeout=30)

        _kill_under_jobs(runner, submit, worker_pids(runner.proc.pid)[0], "transcription")
