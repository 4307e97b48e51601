"""A cancelled image request keeps its slot until ComfyUI let its prompt go (issue 29).

ComfyUI acts on an interrupt only when its running node ends (an `ImageBlur` runs to its
end; checked against the real 0.3.64). A client that leaves, or a job deleted, while the
blur runs: the prompt is interrupted, but the slot stays taken until ComfyUI no longer
runs it, so the next request waits in the runner (its `X-Queue-Wait-Ms` says so) and is
never handed to ComfyUI behind the blur. The fake's blur is held open by the test
(`POST /_fake/blur`), so every step waits on observable state, not on time."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.facet import ComfyImages
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import Param, WorkflowTemplate
from runner.http.asgi import ASGIApp, Message
from runner.http.frontend import FrontEnd
from runner.http.images.handler import ImagesPath
from runner.jobs import JobManager, JobStatus, MemoryJobStore
from runner.jobs.http import job_submitter
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.telemetry.metrics import Metrics
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter
from tests.adapters.comfyui.support import FAST
from tests.fixtures.launch import FakeEngine
from tests.support.poll import eventually_async

pytestmark = pytest.mark.timeout(60)

BLUR = WorkflowTemplate(
    "blur",
    {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": "{{width}}", "height": "{{height}}", "batch_size": 1, "color": 0},
        },
        "2": {
            "class_type": "ImageBlur",
            "inputs": {"image": ["1", 0], "blur_radius": 1, "sigma": 1.0},
        },
        "3": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["2", 0]},
        },
    },
    {
        "width": Param("int", 64, 1, 1024),
        "height": Param("int", 64, 1, 1024),
        "filename_prefix": Param("str", max_length=200),
    },
)
"""EmptyImage -> ImageBlur -> SaveImage: the blur is one node deaf to interrupts."""


@dataclass
class Runner:
    images: ASGIApp  # the image path behind the front-end
    client: httpx.AsyncClient
    engine: ComfyUIEngine
    admission: SchedulerAdmission
    manager: JobManager
    comfy: httpx.AsyncClient

    async def state(self) -> dict[str, Any]:
        doc: dict[str, Any] = (await self.comfy.get("/_fake/comfy")).json()
        return doc

    async def hold_blur(self, hold: bool) -> None:
        await self.comfy.post("/_fake/blur", json={"hold": hold})

    def post(self, size: str, **headers: str) -> Any:
        body = {"model": "blur", "prompt": "x", "size": size}
        headers = {"X-Tenant-ID": "acme", **headers}
        return self.client.post("/v1/images/generations", json=body, headers=headers)


@pytest.fixture
async def runner(
    comfy: FakeEngine, comfy_dir: Path, http: httpx.AsyncClient
) -> AsyncIterator[Runner]:
    server = ComfyUIServer.attach(comfy.url, comfyui_path=str(comfy_dir))
    engine = ComfyUIEngine("blur", server, BLUR, timing=FAST)
    await engine.load()
    config = SchedulerConfig(model_concurrency={"blur": 1}, unlisted_ready=False)
    admission = SchedulerAdmission(config)
    await admission.start()
    manager = JobManager(MemoryJobStore(time.time), None, "runner-1", time.time)
    tenants = TenantsConfig()
    front = FrontEnd(admission, RateLimiter(tenants), tenants, Metrics())
    generator = ImageGenerator(None, timing=FAST, settle_poll_s=0.05)
    images = ImagesPath(
        front.gate,
        {"blur": ComfyImages(engine, generator)},
        None,
        1 << 20,
        submit_job=job_submitter(manager),
    )
    app = front.path(images.serve)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runner") as client:
        yield Runner(app, client, engine, admission, manager, http)
    await http.post("/_fake/blur", json={"hold": False})
    await manager.aclose()
    await admission.stop()
    await server.stop()


async def _blurring(runner: Runner) -> str:
    """Wait until a prompt is inside the blur; its id."""

    async def inside() -> bool:
        return bool((await runner.state())["blurring"])

    await eventually_async(inside)
    (prompt_id,) = (await runner.engine.client.queue()).running
    return prompt_id


async def _next_waits_in_the_runner(runner: Runner, first: str, interrupts: int) -> None:
    """Once `first` was interrupted (the fake counted more than `interrupts`): a new request
    waits in the runner while ComfyUI still runs `first` (nothing pending at ComfyUI); the
    blur let go, it is served."""

    async def interrupted() -> bool:
        return bool((await runner.state())["interrupts"] > interrupts)

    await eventually_async(interrupted)
    second = asyncio.create_task(runner.post("64x48"))

    async def queued() -> bool:
        return runner.admission.queue_depth() == 1

    await eventually_async(queued)
    queue = await runner.engine.client.queue()
    assert queue.running == (first,) and queue.pending == ()
    assert runner.admission.stats().capabilities()["running"] == 1
    await runner.hold_blur(False)
    response: httpx.Response = await asyncio.wait_for(second, 30)
    assert response.status_code == 200, response.text
    assert int(response.headers["x-queue-wait-ms"]) > 0
    assert first not in (await runner.engine.client.queue()).running


async def test_client_gone_keeps_the_slot_until_comfyui_let_the_prompt_go(
    runner: Runner,
) -> None:
    """A client leaves while its prompt is in the blur: the prompt is interrupted, the
    request ends at once, and the next request waits in the runner until the blur ended
    and ComfyUI let the prompt go (then it is served, its queue wait counted)."""
    await runner.hold_blur(True)
    gone = asyncio.Event()
    body = json.dumps({"model": "blur", "prompt": "x", "size": "96x64"}).encode()
    messages: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/images/generations",
        "headers": [(b"x-tenant-id", b"acme"), (b"content-type", b"application/json")],
    }
    request = asyncio.create_task(runner.images(scope, receive, send))
    first = await _blurring(runner)
    interrupts = (await runner.state())["interrupts"]
    gone.set()
    await asyncio.wait_for(request, 10)  # the handler is done; ComfyUI is not
    assert sent == []
    await _next_waits_in_the_runner(runner, first, interrupts)


async def test_deleted_job_keeps_the_slot_until_comfyui_let_the_prompt_go(
    runner: Runner,
) -> None:
    """`DELETE /v1/jobs/{id}` while its prompt is in the blur: the job reads cancelled at
    once, and the next request waits in the runner until ComfyUI let the prompt go."""
    await runner.hold_blur(True)
    accepted = await runner.post("80x64", Prefer="respond-async")
    assert accepted.status_code == 202
    first = await _blurring(runner)
    interrupts = (await runner.state())["interrupts"]
    job = await runner.manager.cancel(accepted.json()["id"], "acme")
    assert job.status is JobStatus.CANCELLED
    await _next_waits_in_the_runner(runner, first, interrupts)
