"""ComfyUI through the runner (issue 10's must-shows): a fake ComfyUI that follows the real
one's HTTP API and websocket events (tests/fixtures/fake_comfyui.py), attached by URL,
with COMFYUI_PATH naming its folder so missing checkpoints are put there."""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.adapters.comfyui.support import png_size
from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.engines import (
    CHECKPOINT,
    GOVERNED,
    caps,
    comfyui_root,
    load_and_wait,
    loaded,
    processes_with,
    unload,
)
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

FETCHED = "fetched.safetensors"


@dataclass
class Setup:
    runner: RunnerProcess
    comfy: FakeEngine
    folder: Path

    def post(self, body: dict[str, Any], tenant: str = "acme", **headers: str) -> httpx.Response:
        return httpx.post(
            self.runner.url + "/v1/images/generations",
            json={"model": "sd", "size": "64x64", **body},
            headers={"X-Tenant-ID": tenant, **headers},
            timeout=60,
        )

    def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(self.comfy.url + "/_fake/comfy").json()
        return doc

    def free_mb(self) -> int:
        stats = httpx.get(self.comfy.url + "/system_stats").json()
        return int(stats["devices"][0]["vram_free"]) // 2**20


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("comfy")
    folder = comfyui_root(root / "ComfyUI")
    source = root / "weights" / FETCHED
    source.parent.mkdir()
    source.write_bytes(b"other fake weights")
    with start_fake(
        "fake_comfyui", "--base-directory", str(folder), "--slow-step-ms", "150"
    ) as comfy:
        models = (
            "models:\n"
            f"  - {{id: sd, backend: comfyui, url: '{comfy.url}', checkpoint: {CHECKPOINT}}}\n"
            f"  - {{id: fetched, backend: comfyui, url: '{comfy.url}', checkpoint: {FETCHED},"
            f" path: '{source}'}}\n"
        )
        env = {**GOVERNED, "COMFYUI_PATH": str(folder), "ENGINE_STATS_INTERVAL_S": "0.2"}
        env["IMAGES_DIR"] = str(root / "images")
        with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
            yield Setup(runner, comfy, folder)


def _png(item: dict[str, Any]) -> bytes:
    return base64.b64decode(item["b64_json"])


def test_comfyui_image_generation_end_to_end(setup: Setup) -> None:
    """A prompt becomes a workflow submitted to ComfyUI, followed over its websocket, and
    the image comes back as b64_json PNGs of the asked size, with the runner's headers."""
    before = setup.state()
    r = setup.post({"prompt": "a red kite", "n": 2, "size": "96x64"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [png_size(_png(item)) for item in data] == [(96, 64), (96, 64)]
    assert r.headers["x-cache-hit"] == "false" and int(r.headers["x-gpu-time-ms"]) >= 0
    assert "x-queue-wait-ms" in r.headers and r.headers["x-request-id"]
    after = setup.state()
    assert after["ws_connects"] > before["ws_connects"]


def test_comfyui_leaves_no_files_and_no_workflow_in_the_images(setup: Setup) -> None:
    """Once answered, nothing of the request stays in ComfyUI's output folder, and the PNGs
    carry no text chunk (ComfyUI writes the whole graph, prompt included, into each)."""
    r = setup.post({"prompt": "a secret green kite", "n": 2})
    assert r.status_code == 200, r.text
    for item in r.json()["data"]:
        png = _png(item)
        assert b"tEXt" not in png and b"secret green kite" not in png
    assert list((setup.folder / "output").rglob("*.png")) == []


def test_comfyui_image_generation_as_an_async_job(setup: Setup) -> None:
    """`Prefer: respond-async`: 202 with the job and its Location; the job runs in the
    background to `succeeded` with the same answer; another tenant cannot read it."""
    r = setup.post({"prompt": "a blue kite"}, tenant="jobs", Prefer="respond-async")
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert r.headers["preference-applied"] == "respond-async"
    assert job["status"] in ("queued", "running") and job["kind"] == "image_generation"
    url = setup.runner.url + r.headers["location"]

    def finished() -> dict[str, Any] | None:
        doc: dict[str, Any] = httpx.get(url, headers={"X-Tenant-ID": "jobs"}).json()
        return doc if doc["status"] in ("succeeded", "failed", "cancelled") else None

    done = eventually(finished, 30, "the job")
    assert done["status"] == "succeeded", done
    assert png_size(_png(done["result"]["data"][0])) == (64, 64)
    assert httpx.get(url, headers={"X-Tenant-ID": "intruder"}).status_code == 404
    assert httpx.delete(url, headers={"X-Tenant-ID": "jobs"}).json()["status"] == "succeeded"


def test_comfyui_dropped_websocket_ends_the_job_from_history(setup: Setup) -> None:
    """ComfyUI cuts the websocket after the first event: the job still ends, read from
    /history, with its image."""
    before = setup.state()["ws_drops"]
    r = setup.post({"prompt": "[fake:drop_ws] a kite in the wind"})
    assert r.status_code == 200, r.text
    assert png_size(_png(r.json()["data"][0])) == (64, 64)
    assert setup.state()["ws_drops"] == before + 1


def test_comfyui_queue_depth_in_capabilities(setup: Setup) -> None:
    """A running prompt shows as `queue.running` (the scheduler's slots held); a second
    request waits in the runner's fair queue (one slot) and counts in `queue.depth`."""
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(setup.post, {"prompt": "[fake:slow] a slow kite"}, "q1")
        eventually(lambda: caps(setup.runner.url)["queue"]["running"] == 1, 20, "running")
        queued = pool.submit(setup.post, {"prompt": "a quick kite"}, "q2")
        eventually(lambda: caps(setup.runner.url)["queue"]["depth"] >= 1, 20, "queued")
        assert held.result(60).status_code == 200
        assert queued.result(60).status_code == 200
    eventually(lambda: caps(setup.runner.url)["queue"]["running"] == 0, 20, "idle")


def test_comfyui_unload_calls_free_and_reports_system_stats(setup: Setup) -> None:
    """Unload asks ComfyUI to /free and answers what /system_stats shows freed after; a
    governed load warms the model up again."""
    assert setup.post({"prompt": "warm"}).status_code == 200
    frees, free_before = setup.state()["frees"], setup.free_mb()
    r = unload(setup.runner.url, "sd")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert setup.state()["frees"] == frees + 1
    assert answer["gpuMemoryFreedMB"] == setup.free_mb() - free_before > 0
    assert "sd" not in loaded(setup.runner.url)
    assert setup.post({"prompt": "gone"}).json()["error"]["code"] == "model_not_loaded"
    done = load_and_wait(setup.runner.url, "sd")
    assert done["status"] == "completed", done.get("error")
    assert setup.post({"prompt": "back"}).status_code == 200


def test_comfyui_url_response_format_serves_the_file(setup: Setup) -> None:
    """`response_format: url` answers a runner URL that serves the PNG; a bad token 404s."""
    r = setup.post({"prompt": "a kite", "response_format": "url"})
    assert r.status_code == 200, r.text
    image_url = r.json()["data"][0]["url"]
    assert image_url.startswith(setup.runner.url + "/v1/images/files/")
    got = httpx.get(image_url)
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    assert png_size(got.content) == (64, 64)
    missing = httpx.get(setup.runner.url + "/v1/images/files/" + "x" * 32 + ".png")
    assert missing.status_code == 404


def test_comfyui_missing_checkpoint_is_put_in_comfyuis_folder(setup: Setup) -> None:
    """A checkpoint ComfyUI did not list was copied from the model's path into its
    checkpoints folder before the warm-up; the model generates with it."""
    assert (setup.folder / "models" / "checkpoints" / FETCHED).read_bytes() == (
        b"other fake weights"
    )
    r = setup.post({"model": "fetched", "prompt": "fetched kite"})
    assert r.status_code == 200, r.text


def test_comfyui_capabilities_claim_no_llm_feature(setup: Setup) -> None:
    """runnerType is `comfyui-<its /system_stats version>` once the engine watch has read
    the version (off the hot path, so it may follow start-up); no LLM flag is claimed; a
    chat request for an image model is a 400."""
    doc = eventually(
        lambda: (d := caps(setup.runner.url))["runnerType"] == "comfyui-0.3.64" and d,
        what="runnerType with ComfyUI's version",
    )
    flags = doc["capabilities"]
    assert flags.pop("multiTenant") is True and not any(flags.values())
    chat = {"model": "sd", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(setup.runner.url + "/v1/chat/completions", json=chat)
    assert r.status_code == 400 and "images/generations" in r.json()["error"]["message"]


def test_comfyui_spawned_server_death_fails_its_model_and_a_load_respawns(
    tmp_path: Path,
) -> None:
    """ComfyUI started from COMFYUI_PATH dies: its model reads failed with the exit code and
    requests get a clear 503; a governed load starts a new ComfyUI and the model serves."""
    folder = comfyui_root(tmp_path / "ComfyUI")
    models = f"models:\n  - {{id: sd, backend: comfyui, checkpoint: {CHECKPOINT}, preload: true}}\n"
    env = {**GOVERNED, "COMFYUI_PATH": str(folder), "COMFYUI_CPU": "true"}
    with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
        [(pid, argv)] = processes_with(str(folder / "main.py"), parent=runner.proc.pid)
        flags = ["--listen", "127.0.0.1", "--port", argv[5], "--disable-auto-launch", "--cpu"]
        assert argv[2:] == [*flags, "--disable-metadata"]
        os.kill(pid, signal.SIGKILL)
        failed = eventually(lambda: caps(runner.url)["models"]["failed"], 10, "failed")
        assert failed[0]["id"] == "sd" and failed[0]["exitCode"] == -9
        body = {"model": "sd", "prompt": "a kite", "size": "64x64"}
        r = httpx.post(runner.url + "/v1/images/generations", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable"
        assert "SIGKILL" in r.json()["error"]["reason"]
        assert load_and_wait(runner.url, "sd")["status"] == "completed"
        [(again, _)] = processes_with(str(folder / "main.py"), parent=runner.proc.pid)
        assert again != pid
        assert httpx.post(runner.url + "/v1/images/generations", json=body).status_code == 200
