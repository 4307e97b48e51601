"""POST /v1/images/generations through the ASGI handler: headers, tenants, admission, the
runner's error envelope, the async job form with a signed webhook, and client disconnects."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from adapters.comfyui import within_comfyui
from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.facet import ComfyImages
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import (
    MODEL_FREE_TEST,
    TXT2IMG,
    Param,
    WorkflowTemplate,
)
from adapters.image_store import FILES_PATH, ImageStore
from runner.http.asgi import Message, Receive, Scope, Send
from runner.http.frontend import FrontEnd
from runner.http.images.handler import ImageFiles, ImagesPath
from runner.jobs import (
    JobManager,
    JobNotFound,
    JobStatus,
    MemoryJobStore,
    RetryPolicy,
    WebhookSender,
)
from runner.jobs.http import job_submitter
from runner.jobs.outbound import OutboundPolicy
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.telemetry.metrics import Metrics
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter
from tests.adapters.comfyui.support import CHECKPOINT, FAST, png_size
from tests.fixtures.launch import FakeEngine
from tests.support.poll import eventually_async

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
HOOK = "https://hooks.example.test/images"


async def _public(host: str, port: int) -> list[str]:
    """The test's receiver name resolves to a public address (a MockTransport answers)."""
    return ["93.184.216.34"]


LOOSE = WorkflowTemplate(
    "loose",
    TXT2IMG.graph,
    {**TXT2IMG.params, "width": Param("int", 64, 1, 4096), "height": Param("int", 64, 1, 4096)},
)
"""txt2img with looser size bounds than ComfyUI's EmptyLatentImage (min 16), built here
without `load_template` (which would refuse it: `within_comfyui`), so it stands for a node
whose limits the runner does not know: ComfyUI's own validation refuses what ours let
through."""
WIDE = within_comfyui(
    WorkflowTemplate(
        "wide",
        MODEL_FREE_TEST.graph,
        {**MODEL_FREE_TEST.params, "width": Param("int", 64), "height": Param("int", 64)},
    )
)
"""The model-free graph with no declared size bounds, loaded as the runner loads templates:
ComfyUI's (EmptyImage: 1..16384) are its bounds."""


@dataclass
class Runner:
    app: Any
    manager: JobManager
    hooks: list[httpx.Request]
    client: httpx.AsyncClient
    engine: ComfyUIEngine
    jobs: MemoryJobStore


@pytest.fixture
async def runner(comfy: FakeEngine, comfy_dir: Path, tmp_path: Path) -> AsyncIterator[Runner]:
    server = ComfyUIServer.attach(comfy.url, comfyui_path=str(comfy_dir))
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT, timing=FAST)
    loose = ComfyUIEngine("loose", server, LOOSE, CHECKPOINT, timing=FAST)
    free = ComfyUIEngine("free", server, MODEL_FREE_TEST, timing=FAST)  # declares no x_*
    wide = ComfyUIEngine("wide", server, WIDE, timing=FAST)
    for model in (engine, loose, free, wide):
        await model.load()
    concurrency = {"sd": 1, "loose": 1, "free": 1, "wide": 1}
    config = SchedulerConfig(model_concurrency=concurrency, unlisted_ready=False)
    admission = SchedulerAdmission(config)
    await admission.start()
    hooks: list[httpx.Request] = []

    def receive_hook(request: httpx.Request) -> httpx.Response:
        hooks.append(request)
        return httpx.Response(204)

    hook_client = httpx.AsyncClient(transport=httpx.MockTransport(receive_hook))
    sender = WebhookSender(
        hook_client, SECRET, retry=RetryPolicy(attempts=1), policy=OutboundPolicy(resolve=_public)
    )
    jobs = MemoryJobStore(time.time)
    manager = JobManager(jobs, sender, "runner-1", time.time)
    store = ImageStore(tmp_path / "images")
    tenants = TenantsConfig()
    front = FrontEnd(admission, RateLimiter(tenants), tenants, Metrics())
    generator = ImageGenerator(timing=FAST)
    models = {"sd": engine, "loose": loose, "free": free, "wide": wide}
    images = ImagesPath(
        front.gate,
        {name: ComfyImages(model, generator) for name, model in models.items()},
        store,
        1 << 20,
        submit_job=job_submitter(manager),
    )
    files, generations = ImageFiles(store), front.path(images.serve)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        target = files if scope["path"].startswith(FILES_PATH) else generations
        await target(scope, receive, send)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://runner") as client:
        yield Runner(app, manager, hooks, client, engine, jobs)
    await manager.aclose()
    await admission.stop()
    await hook_client.aclose()
    await server.stop()


async def _prompts_submitted(runner: Runner) -> int:
    """`POST /prompt` calls the fake ComfyUI has seen."""
    async with httpx.AsyncClient(base_url=runner.engine.base_url) as fake:
        stats = (await fake.get("/_fake/stats")).json()
    return int(stats["by_path"].get("/prompt", 0))


def _post(runner: Runner, body: dict[str, Any], tenant: str = "acme", **headers: str) -> Any:
    return runner.client.post(
        "/v1/images/generations", json=body, headers={"X-Tenant-ID": tenant, **headers}
    )


async def test_images_answer_in_openai_shape_with_the_runners_headers(runner: Runner) -> None:
    """200 `{created, data: [{b64_json}]}`, PNGs of the asked size, and the runner's headers."""
    response = await _post(
        runner,
        {"model": "sd", "prompt": "a red kite", "size": "96x64", "n": 2},
        **{"X-Request-Id": "img-1"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [png_size(base64.b64decode(d["b64_json"])) for d in body["data"]] == [(96, 64)] * 2
    headers = response.headers
    assert headers["x-request-id"] == "img-1"
    assert headers["x-cache-hit"] == "false"
    assert int(headers["x-queue-wait-ms"]) >= 0 and int(headers["x-gpu-time-ms"]) >= 0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "sd", "prompt": "x", "size": "big"}, 400, "invalid_image_request"),
        ({"model": "sd", "prompt": "x", "size": "4096x4096"}, 400, "invalid_workflow_parameter"),
        ({"model": "nope", "prompt": "x"}, 404, "model_not_found"),
        ({"model": "sd", "prompt": "x", "webhook": HOOK}, 400, "invalid_image_request"),
    ],
)
async def test_images_refusals_use_the_runners_envelope(
    runner: Runner, body: dict[str, Any], status: int, code: str
) -> None:
    """Bad fields, bounds, unknown models: the runner's error envelope and status."""
    response = await _post(runner, body)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "body",
    [
        {"model": "sd", "prompt": "x", "size": "4096x4096"},  # over the workflow's 2048
        {"model": "sd", "prompt": "x", "n": 9},  # batch_size at most 8
        {"model": "free", "prompt": "x", "x_steps": 30},  # a parameter it does not declare
        {"model": "wide", "prompt": "x", "size": "20000x64"},  # over ComfyUI's 16384
    ],
    ids=["size-4096", "n-9", "undeclared-x", "size-20000-comfyuis-limit"],
)
async def test_images_async_form_refuses_before_the_202_as_the_sync_form(
    runner: Runner, body: dict[str, Any]
) -> None:
    """With `Prefer: respond-async`, what the synchronous request refuses with 400 is the
    same 400 (code and message), no job is created and nothing reaches ComfyUI (a size
    only ComfyUI's limits refuse included: the template took them on at load)."""
    submitted = await _prompts_submitted(runner)
    sync = await _post(runner, body)
    async_form = await _post(runner, body, Prefer="respond-async")
    assert sync.status_code == async_form.status_code == 400, async_form.text
    assert async_form.json()["error"] == sync.json()["error"]
    assert "location" not in async_form.headers
    assert len(runner.jobs) == 0
    assert await _prompts_submitted(runner) == submitted


async def test_comfyui_400_is_our_400_with_the_node_errors(runner: Runner) -> None:
    """What ComfyUI's own validation refuses comes back as a 400 naming node and error."""
    response = await _post(runner, {"model": "loose", "prompt": "x", "size": "8x8"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "comfyui_workflow_rejected"
    assert error["comfyui_error"] == "prompt_outputs_failed_validation"
    assert "node 5 (EmptyLatentImage): value_smaller_than_min" in error["message"]
    assert error["node_errors"]["5"]["errors"][0]["type"] == "value_smaller_than_min"
    assert int(response.headers["x-queue-wait-ms"]) >= 0  # refused after admission


async def test_images_url_form_is_served_by_the_file_route(runner: Runner) -> None:
    """response_format=url: the URL serves the PNG; an unknown token is a 404."""
    response = await _post(runner, {"model": "sd", "prompt": "a kite", "response_format": "url"})
    url = response.json()["data"][0]["url"]
    assert url.startswith("http://runner/v1/images/files/")  # from the request's Host
    image = await runner.client.get(url)
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    assert png_size(image.content) == (512, 512)
    missing = await runner.client.get(FILES_PATH + "A" * 32 + ".png")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "image_not_found"


async def test_images_async_form_is_a_job_with_a_signed_webhook(runner: Runner) -> None:
    """Prefer: respond-async -> 202 + Location; the job runs, succeeds with the images, is
    readable by its tenant only, and its webhook is signed (Standard Webhooks)."""
    body = {"model": "sd", "prompt": "a kite", "size": "64x64", "webhook": HOOK}
    response = await _post(runner, body, Prefer="respond-async")
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert response.headers["location"] == f"/v1/jobs/{job_id}"
    assert response.headers["preference-applied"] == "respond-async"
    await runner.manager.join(job_id)
    job = await runner.manager.get(job_id, "acme")
    assert job.status is JobStatus.SUCCEEDED, job.error
    assert job.kind == "image_generation" and job.progress is not None
    assert job.progress.done == job.progress.total
    (item,) = job.result["data"]  # type: ignore[index]
    assert png_size(base64.b64decode(item["b64_json"])) == (64, 64)
    with pytest.raises(JobNotFound):
        await runner.manager.get(job_id, "someone-else")
    (hook,) = runner.hooks
    payload = Webhook(SECRET).verify(hook.content, dict(hook.headers))
    assert payload["data"]["id"] == job_id and payload["data"]["status"] == "succeeded"


async def test_images_async_job_cancel_interrupts_the_prompt(runner: Runner) -> None:
    """DELETE of the job (manager.cancel) interrupts its prompt at ComfyUI."""
    body = {"model": "sd", "prompt": "[fake:slow]", "size": "64x64", "x_steps": 50}
    response = await _post(runner, body, Prefer="respond-async")
    job_id = response.json()["id"]

    async def sampling() -> bool:
        job = await runner.manager.get(job_id, "acme")
        return job.progress is not None and job.progress.done > 3

    await eventually_async(sampling)
    (prompt_id,) = (await runner.engine.client.queue()).running
    job = await runner.manager.cancel(job_id, "acme")
    assert job.status is JobStatus.CANCELLED

    async def interrupted() -> bool:
        entry = await runner.engine.client.history(prompt_id)
        return entry is not None and entry["status"]["messages"][-1][0] == "execution_interrupted"

    await eventually_async(interrupted)


async def test_client_disconnect_interrupts_the_prompt(runner: Runner) -> None:
    """A client that goes away while its image is generated: the prompt is interrupted and
    nothing is sent to it."""
    gone = asyncio.Event()
    body = json.dumps({"model": "sd", "prompt": "[fake:slow]", "x_steps": 50}).encode()
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
    task = asyncio.create_task(runner.app(scope, receive, send))

    async def running() -> bool:
        return bool((await runner.engine.client.queue()).running)

    await eventually_async(running)
    (prompt_id,) = (await runner.engine.client.queue()).running
    gone.set()
    await asyncio.wait_for(task, 10)
    assert sent == []

    async def interrupted() -> bool:
        entry = await runner.engine.client.history(prompt_id)
        return entry is not None and entry["status"]["messages"][-1][0] == "execution_interrupted"

    await eventually_async(interrupted)
    with contextlib.suppress(Exception):
        task.result()
