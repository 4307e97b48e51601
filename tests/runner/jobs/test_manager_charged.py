"""An async job is charged as its synchronous form (issue 36, item 7): the same usage
record (one request, its real outcome, the images it made), once, through a real runner in
front of the fake ComfyUI (attached by URL)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures.launch import start_fake
from tests.support.engines import CHECKPOINT, GOVERNED, comfyui_root
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

FAIL = "a kite [fake:execution_error]"  # the fake's node raises: execution_error


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerProcess]:
    root = tmp_path_factory.mktemp("jobs")
    folder = comfyui_root(root / "ComfyUI")
    with start_fake("fake_comfyui", "--base-directory", str(folder)) as comfy:
        models = (
            f"models:\n  - {{id: sd, backend: comfyui, url: '{comfy.url}',"
            f" checkpoint: {CHECKPOINT}}}\n"
        )
        env = {**GOVERNED, "COMFYUI_PATH": str(folder), "IMAGES_DIR": str(root / "images")}
        with start_runner(models_file=models, env=env, ready_timeout=60) as proc:
            yield proc


def _post(r: RunnerProcess, tenant: str, prompt: str, **headers: str) -> httpx.Response:
    body = {"model": "sd", "prompt": prompt, "n": 2, "size": "64x64"}
    url = r.url + "/v1/images/generations"
    return httpx.post(url, json=body, headers={"X-Tenant-ID": tenant, **headers}, timeout=60)


def _job(r: RunnerProcess, tenant: str, prompt: str) -> dict[str, Any]:
    """Submit as a job and wait for it to end."""
    answer = _post(r, tenant, prompt, Prefer="respond-async")
    assert answer.status_code == 202, answer.text
    url = r.url + answer.headers["location"]

    def ended() -> dict[str, Any] | None:
        job: dict[str, Any] = httpx.get(url, headers={"X-Tenant-ID": tenant}, timeout=10).json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    done: dict[str, Any] = eventually(ended, timeout=60, what="the job's end")
    return done


def _record(r: RunnerProcess, tenant: str) -> dict[str, Any]:
    """The tenant's usage record for the model, less what differs by nature (the hour,
    the tenant, the seconds)."""
    doc = httpx.get(r.url + "/v1/usage", headers={"X-Tenant-ID": tenant}, timeout=30).json()
    rows = [row for row in doc["data"] if row["tenant"] == tenant and row["model"] == "sd"]
    assert len(rows) == 1, doc
    drop = ("tenant", "start", "engineSeconds", "queueSeconds")
    return {k: v for k, v in rows[0].items() if k not in drop}


def test_jobs_charged_as_their_synchronous_form(runner: RunnerProcess) -> None:
    """A job that makes 2 images is recorded as the synchronous request that makes them:
    one request, ok, 2 images (not a second request, nor the 202 as the outcome)."""
    assert _post(runner, "sync-ok", "a red kite").status_code == 200
    assert _job(runner, "job-ok", "a red kite")["status"] == "succeeded"
    sync = _record(runner, "sync-ok")
    assert sync["requests"] == 1 and sync["images"] == 2
    assert _record(runner, "job-ok") == sync


def test_jobs_charged_with_their_real_outcome(runner: RunnerProcess) -> None:
    """A job whose prompt fails in ComfyUI is recorded failed, as its synchronous form is,
    never ok for the 202 that took it."""
    assert _post(runner, "sync-fail", FAIL).status_code >= 500
    assert _job(runner, "job-fail", FAIL)["status"] == "failed"
    sync = _record(runner, "sync-fail")
    assert sync["requests"] == 1 and sync["requestsByOutcome"]["failed"] == 1
    assert _record(runner, "job-fail") == sync
