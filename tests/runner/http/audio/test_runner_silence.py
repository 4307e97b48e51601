"""A speech worker that stops answering mid-transcription, through a real runner process
with the real faster-whisper worker (docs/reliability.md, section 5): SIGSTOP, and after
ENGINE_READ_TIMEOUT_S (3 s here) without a message the request is 504 `engine_timeout`;
the runner kills the stuck worker, and from there it is the crash path (section 3): the
model restarts (`restart: true`) and the request queued behind it is served by the new
worker."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from tests.adapters.whisper.speech import SpeechFiles, has_words
from tests.runner.http.audio.runner_kit import (
    loaded,
    metric,
    transcribe,
    whisper_models_file,
    worker_pids,
)
from tests.support.engines import alive
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def runner(whisper_model: str) -> Iterator[RunnerProcess]:
    """`whisper` (tiny.en, one slot, preloaded, restarted when its worker dies) and
    ENGINE_READ_TIMEOUT_S=3."""
    models = whisper_models_file(whisper_model, parallel=1, preload=True, restart=True)
    env = {"WHISPER_CPU_THREADS": "1", "ENGINE_READ_TIMEOUT_S": "3"}
    with start_runner(models_file=models, env=env, ready_timeout=60) as proc:
        yield proc


def _stop_worker_when_busy(url: str, runner_pid: int) -> int:
    """SIGSTOP the worker once a transcription is on it; its pid."""
    (worker,) = worker_pids(runner_pid)
    eventually(lambda: metric(url, "quorum_requests_in_flight", model="whisper") >= 1)
    os.kill(worker, signal.SIGSTOP)
    return worker


def test_runner_speech_silent_worker_is_504_and_the_restarted_one_serves_the_queue(
    runner: RunnerProcess, speech: SpeechFiles
) -> None:
    """The stopped worker's request is 504 `engine_timeout` naming the bound; the worker
    is killed (gone, not just stopped), the model restarts, the request queued behind it
    is served by the new worker; the metrics count a timeout, a crash and a restart."""
    url = runner.url
    with ThreadPoolExecutor(2) as pool:
        stuck = pool.submit(transcribe, url, speech.long)
        worker = _stop_worker_when_busy(url, runner.proc.pid)
        queued = pool.submit(transcribe, url, speech.hello)
        eventually(lambda: httpx.get(url + "/health", timeout=10).json()["queueDepth"] >= 1)
        answer, after = stuck.result(), queued.result()
    assert answer.status_code == 504, answer.text
    error = answer.json()["error"]
    assert error["code"] == "engine_timeout" and "3 s" in error["message"], error
    assert after.status_code == 200 and has_words(after.json()["text"]), after.text
    assert not alive(worker)
    (new_worker,) = worker_pids(runner.proc.pid)
    assert new_worker != worker
    timeouts = metric(url, "quorum_transcriptions_total", model="whisper", status="engine_timeout")
    assert timeouts == 1
    assert metric(url, "quorum_engine_crashes_total", model="whisper") == 1
    assert metric(url, "quorum_speech_worker_restarts_total", model="whisper") == 1


def test_runner_speech_silent_worker_mid_stream_ends_with_an_engine_timeout_event(
    runner: RunnerProcess, speech: SpeechFiles
) -> None:
    """stream=true, the worker stopped after the answer began: the stream ends with one
    `error` event whose code is `engine_timeout`; the model then serves again."""
    url = runner.url
    eventually(lambda: loaded(url), timeout=60, every=0.1)
    (worker,) = worker_pids(runner.proc.pid)
    stopped = False
    events = []
    form = {"model": "whisper", "stream": "true"}
    files = {"file": ("long.wav", speech.long.read_bytes(), "application/octet-stream")}
    with httpx.stream(
        "POST", url + "/v1/audio/transcriptions", data=form, files=files, timeout=60
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(orjson.loads(line.removeprefix("data: ")))
            if not stopped:
                os.kill(worker, signal.SIGSTOP)
                stopped = True
    assert stopped and "error" in events[-1], events[-3:]
    assert events[-1]["error"]["code"] == "engine_timeout", events[-1]
    eventually(lambda: loaded(url), timeout=60, every=0.1)
    assert transcribe(url, speech.hello).status_code == 200


def test_runner_speech_silent_worker_fails_the_async_job_with_engine_timeout(
    runner: RunnerProcess, speech: SpeechFiles
) -> None:
    """A transcription job whose worker is stopped mid-way ends `failed` with
    `engine_timeout`; the model then serves again."""
    url = runner.url
    eventually(lambda: loaded(url), timeout=60, every=0.1)
    headers = {"X-Tenant-ID": "jobs", "Prefer": "respond-async"}
    r = transcribe(url, speech.long, headers=headers)
    assert r.status_code == 202, r.text
    job_url = url + r.headers["location"]

    def job() -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(job_url, headers=headers, timeout=10).json()
        return doc

    eventually(lambda: job()["status"] == "running")
    _stop_worker_when_busy(url, runner.proc.pid)
    ended = eventually(lambda: (d := job())["status"] in ("succeeded", "failed") and d)
    assert ended["status"] == "failed" and ended["error"]["code"] == "engine_timeout", ended
    eventually(lambda: loaded(url), timeout=60, every=0.1)
    assert transcribe(url, speech.hello).status_code == 200
