"""The runner process in front of the fake ComfyUI (issue 29): a client that leaves while
its prompt is inside a node keeps the slot until ComfyUI let the prompt go, and
`queue.running` says so from the scheduler's own count; images kept for URLs are removed
on SIGTERM, and after a SIGKILL by the next start. The fake's `ImageBlur` is held open by
the test (`POST /_fake/blur`), as the real one runs to its end whatever the interrupt."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.engines import caps, comfyui_root
from tests.support.poll import eventually
from tests.support.runner_proc import RunnerProcess, start_runner

pytestmark = pytest.mark.timeout(120)

BLUR = {
    "name": "blur",
    "params": {
        "width": {"type": "int", "default": 64, "max": 1024},
        "height": {"type": "int", "default": 64, "max": 1024},
        "filename_prefix": {"type": "str"},
    },
    "graph": {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": "{{width}}", "height": "{{height}}", "batch_size": 1, "color": 0},
        },
        "2": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["1", 0], "blur_radius": 1, "sigma": 1},
        },
        "3": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["2", 0]},
        },
    },
}


@dataclass
class Setup:
    comfy: FakeEngine
    models: str
    tmp: Path  # the runners' TMPDIR: where their image folders are

    def runner(self) -> Any:
        env = {"TMPDIR": str(self.tmp), "ENGINE_STATS_INTERVAL_S": "60"}
        return start_runner(models_file=self.models, env=env, ready_timeout=60)

    def fake(self, path: str) -> Any:
        return httpx.get(self.comfy.url + path).json()

    def hold_blur(self, hold: bool) -> None:
        httpx.post(self.comfy.url + "/_fake/blur", json={"hold": hold})

    def image_files(self) -> list[Path]:
        return sorted(self.tmp.glob("quorum-images-*/*.png"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("comfy")
    folder = comfyui_root(root / "ComfyUI")
    template = root / "blur.json"
    template.write_text(json.dumps(BLUR))
    tmp = root / "tmp"
    tmp.mkdir()
    with start_fake("fake_comfyui", "--base-directory", str(folder)) as comfy:
        models = (
            "models:\n"
            f"  - {{id: blur, backend: comfyui, url: '{comfy.url}', workflow: '{template}'}}\n"
        )
        yield Setup(comfy, models, tmp)
        httpx.post(comfy.url + "/_fake/blur", json={"hold": False})


def _post(runner: RunnerProcess, size: str, **fields: Any) -> httpx.Response:
    body = {"model": "blur", "prompt": "x", "size": size, **fields}
    return httpx.post(
        runner.url + "/v1/images/generations",
        json=body,
        headers={"X-Tenant-ID": "acme"},
        timeout=60,
    )


def _send_and_leave_later(runner: RunnerProcess, size: str) -> socket.socket:
    """A request on a raw connection; closing the socket is the client leaving."""
    body = json.dumps({"model": "blur", "prompt": "x", "size": size}).encode()
    head = (
        f"POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Tenant-ID: acme\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    conn = socket.create_connection(("127.0.0.1", runner.port))
    conn.sendall(head + body)
    return conn


def test_client_gone_holds_the_slot_and_queue_running_until_comfyui_let_go(
    setup: Setup,
) -> None:
    """The client leaves during the blur: `queue.running` stays 1 while ComfyUI still runs
    the interrupted prompt, the next request waits in the runner (`queue.depth` 1, nothing
    pending at ComfyUI), and once the blur ends it is served with its queue wait counted
    and `queue.running` reads 0."""
    with setup.runner() as runner, ThreadPoolExecutor(1) as pool:
        setup.hold_blur(True)
        interrupts = setup.fake("/_fake/comfy")["interrupts"]
        conn = _send_and_leave_later(runner, "96x64")
        eventually(lambda: setup.fake("/_fake/comfy")["blurring"], 20, "inside the blur")
        assert caps(runner.url)["queue"]["running"] == 1
        conn.close()
        eventually(lambda: setup.fake("/_fake/comfy")["interrupts"] > interrupts, 20, "interrupt")
        second = pool.submit(_post, runner, "64x48")
        eventually(lambda: caps(runner.url)["queue"]["depth"] == 1, 20, "waiting in the runner")
        queue = setup.fake("/queue")
        assert len(queue["queue_running"]) == 1 and queue["queue_pending"] == []
        assert caps(runner.url)["queue"]["running"] == 1
        setup.hold_blur(False)
        response = second.result(60)
        assert response.status_code == 200, response.text
        assert int(response.headers["x-queue-wait-ms"]) > 0
        eventually(lambda: caps(runner.url)["queue"]["running"] == 0, 20, "idle")
        assert runner.terminate() == 0


def test_url_images_are_removed_on_sigterm_and_after_sigkill_at_the_next_start(
    setup: Setup,
) -> None:
    """An image answered by URL lives in the runner's folder under TMPDIR: a SIGKILL leaves
    it, the next runner's start removes it; a SIGTERM removes the runner's images and its
    folder."""
    with setup.runner() as killed:
        assert _post(killed, "64x64", response_format="url").status_code == 200
        (left,) = setup.image_files()
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait(10)
    assert left.is_file()
    with setup.runner() as runner:
        assert not left.exists() and not left.parent.exists()
        response = _post(runner, "64x64", response_format="url")
        assert response.status_code == 200
        (kept,) = setup.image_files()
        assert httpx.get(response.json()["data"][0]["url"]).status_code == 200
        assert runner.terminate() == 0
    assert not kept.exists() and list(setup.tmp.glob("quorum-images-*")) == []
