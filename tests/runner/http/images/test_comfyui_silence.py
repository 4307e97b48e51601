"""A ComfyUI prompt stuck in a node that says nothing, through the runner
(docs/reliability.md, section 5): after ENGINE_READ_TIMEOUT_S (2 s here) without an event
about it, a request is 504 `engine_timeout` and an async job fails with that code; the
runner interrupts the prompt at ComfyUI, frees its slot, and the next request is served.

ComfyUI is the fake (started by the runner from COMFYUI_PATH, as a real one would be): its
HTTP keeps answering while a `CLIPTextEncode` holding `[fake:hang]` runs until interrupted,
as a real node without a progress hook does."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.runner.http.audio.runner_kit import metric
from tests.support.engines import CHECKPOINT, comfyui_root, processes_with
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

HANG = "[fake:hang]"
ASYNC = {"X-Tenant-ID": "jobs", "Prefer": "respond-async"}


@dataclass
class Setup:
    runner: RunnerProcess
    comfy_url: str  # the fake ComfyUI the runner started

    def post(self, prompt: str, **headers: str) -> httpx.Response:
        return httpx.post(
            self.runner.url + "/v1/images/generations",
            json={"model": "sd", "prompt": prompt, "size": "64x64"},
            headers={"X-Tenant-ID": "acme", **headers},
            timeout=60,
        )

    def comfy(self, path: str) -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(self.comfy_url + path, timeout=10).json()
        return doc

    def comfy_running(self) -> int:
        return len(self.comfy("/queue")["queue_running"])

    def interrupts(self) -> int:
        return int(self.comfy("/_fake/comfy")["interrupts"])


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """A runner with one ComfyUI model (one slot) on a ComfyUI it started itself, and
    ENGINE_READ_TIMEOUT_S=2."""
    root = comfyui_root(tmp_path_factory.mktemp("silence") / "ComfyUI")
    models = (
        f"models:\n  - {{id: sd, backend: comfyui, checkpoint: {CHECKPOINT}, preload: true,"
        " parallel: 1}\n"
    )
    env = {"COMFYUI_PATH": str(root), "COMFYUI_CPU": "true", "ENGINE_READ_TIMEOUT_S": "2"}
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        [(_, argv)] = processes_with(str(root / "main.py"), parent=runner.proc.pid)
        yield Setup(runner, f"http://127.0.0.1:{argv[argv.index('--port') + 1]}")


def test_comfyui_silence_request_is_504_and_the_queued_one_is_served(setup: Setup) -> None:
    """A request whose prompt says nothing for 2 s is 504 `engine_timeout` naming the
    bound; the runner interrupted the prompt at ComfyUI (its queue empties), and the
    request queued in the runner behind it is then served."""
    interrupts = setup.interrupts()
    with ThreadPoolExecutor(2) as pool:
        stuck = pool.submit(setup.post, f"a kite {HANG}")
        eventually(lambda: setup.comfy_running() == 1, 30, "the stuck prompt at ComfyUI")
        queued = pool.submit(setup.post, "a quick kite")
        answer, after = stuck.result(60), queued.result(60)
    assert answer.status_code == 504, answer.text
    error = answer.json()["error"]
    assert error["code"] == "engine_timeout" and "2 s" in error["message"], error
    assert "interrupted" in error["message"]
    assert after.status_code == 200, after.text
    assert setup.interrupts() == interrupts + 1
    eventually(lambda: setup.comfy_running() == 0, 10, "ComfyUI idle")
    url = setup.runner.url
    assert metric(url, "quorum_requests_total", model="sd", status="504") >= 1


def test_comfyui_silence_async_job_fails_with_engine_timeout(setup: Setup) -> None:
    """An image job whose prompt says nothing for 2 s ends `failed` with `engine_timeout`;
    the prompt was interrupted at ComfyUI and the next request is served."""
    interrupts = setup.interrupts()
    r = setup.post(f"a job kite {HANG}", **ASYNC)
    assert r.status_code == 202, r.text
    url = setup.runner.url + r.headers["location"]

    def ended() -> dict[str, Any] | None:
        doc: dict[str, Any] = httpx.get(url, headers=ASYNC, timeout=10).json()
        return doc if doc["status"] in ("succeeded", "failed", "cancelled") else None

    job = eventually(ended, 30, "the job's end")
    assert job["status"] == "failed", job
    assert job["error"]["code"] == "engine_timeout", job
    assert setup.interrupts() == interrupts + 1
    assert setup.post("the next kite").status_code == 200
