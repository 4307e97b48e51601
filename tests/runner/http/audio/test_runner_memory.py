"""Governed load and unload of a speech model on a real runner: unload returns the memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.adapters.whisper.speech import SpeechFiles, has_words, tree_rss_bytes
from tests.runner.http.audio.runner_kit import transcribe, whisper_models_file, worker_pids
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner
from tests.support.tokens import DEV_REGISTRY, dev_token

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024


@pytest.fixture
def governed_runner(whisper_model: str) -> Iterator[RunnerProcess]:
    """A runner with `whisper` in its models file, not loaded, lifecycle governed."""
    env = {"GOVERNANCE_REGISTRY": str(DEV_REGISTRY), "WHISPER_CPU_THREADS": "1"}
    with start_runner(models_file=whisper_models_file(whisper_model), env=env) as runner:
        yield runner


def _load(url: str) -> dict[str, Any]:
    token = dev_token("model-load", "whisper", {})
    r = httpx.post(url + "/v1/models/load", json={"modelId": "whisper", "verifiedOpToken": token})
    assert r.status_code == 202, r.text
    task_id = r.json()["taskId"]

    def finished() -> dict[str, Any] | None:
        doc: dict[str, Any] = httpx.get(f"{url}/v1/models/load/{task_id}").json()
        return doc if doc["status"] in ("completed", "failed", "cancelled") else None

    done: dict[str, Any] = eventually(finished, timeout=60, every=0.1)
    return done


def _unload(url: str) -> dict[str, Any]:
    token = dev_token("model-unload", "whisper", {})
    body = {"modelId": "whisper", "verifiedOpToken": token}
    r = httpx.post(url + "/v1/models/unload", json=body, timeout=60)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_runner_speech_unload_returns_the_workers_memory(
    governed_runner: RunnerProcess, speech: SpeechFiles
) -> None:
    """Resident memory of the runner's process tree after a governed unload is within 10%
    of what it was before the load; the worker process is gone and the model answers 404."""
    url, pid = governed_runner.url, governed_runner.proc.pid
    not_loaded = transcribe(url, speech.hello)
    assert not_loaded.status_code == 404
    assert not_loaded.json()["error"]["code"] == "model_not_loaded"
    before = tree_rss_bytes(pid)
    task = _load(url)
    assert task["status"] == "completed" and task["gpuMemoryUsedMB"] > 0, task
    r = transcribe(url, speech.hello)
    assert r.status_code == 200 and has_words(r.json()["text"])
    loaded = tree_rss_bytes(pid)
    assert len(worker_pids(pid)) == 1
    freed = _unload(url)
    after = tree_rss_bytes(pid)
    assert freed["modelId"] == "whisper" and freed["gpuMemoryFreedMB"] > 0
    assert worker_pids(pid) == []
    assert loaded - before > 50 * MIB, (before, loaded)  # the worker held real memory
    assert abs(after - before) <= 0.10 * before, (before, loaded, after)
    gone = transcribe(url, speech.hello)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_loaded"
