"""Every node input checked before the 202 (issue 41): the request's `x_seed`, or the seed
the runner draws, within the bound of every input the seed feeds; a text fed into a
fixed-choice input one of its choices; `x_seed` for a template without a seed refused like
any undeclared `x_*` field. What the synchronous request refuses with 400 the async one
refuses before its 202, and nothing reaches ComfyUI (the fake validates as ComfyUI 0.3.64's
`validate_inputs` does, so what passes here it accepts)."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.comfyui import within_comfyui
from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.facet import ComfyImages
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import MODEL_FREE_TEST, Param, WorkflowTemplate
from adapters.image_request import ImageRequest
from faults import ConfigError
from runner.http.frontend import FrontEnd
from runner.http.images.handler import ImagesPath
from runner.jobs import JobManager, JobStatus, MemoryJobStore
from runner.jobs.http import job_submitter
from runner.scheduler import SchedulerAdmission, SchedulerConfig
from runner.telemetry.metrics import Metrics
from tenants.config import TenantsConfig
from tenants.ratelimit import RateLimiter
from tests.adapters.comfyui.support import FAST, png_size
from tests.fixtures.launch import FakeEngine

pytestmark = pytest.mark.timeout(60)

_SAVE = {
    "class_type": "SaveImage",
    "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["2", 0]},
}
COLOURED = within_comfyui(
    WorkflowTemplate(
        "coloured",
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": "{{seed}}"},
            },
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": _SAVE,
        },
        {"seed": Param("int", 0), "filename_prefix": Param("str", max_length=200)},
    )
)
"""The seed feeds `EmptyImage.color` (ComfyUI: at most 16777215), loaded as the runner loads
templates: the seed takes that bound on."""
SCALED = within_comfyui(
    WorkflowTemplate(
        "scaled",
        {
            "1": {
                "class_type": "EmptyImage",
                "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
            },
            "2": {
                "class_type": "ImageScale",
                "inputs": {
                    "image": ["1", 0],
                    "upscale_method": "{{prompt}}",
                    "width": 16,
                    "height": 0,
                    "crop": "disabled",
                },
            },
            "3": _SAVE,
        },
        {"prompt": Param("str"), "filename_prefix": Param("str", max_length=200)},
    )
)
"""The prompt feeds `ImageScale.upscale_method`, a fixed choice (nearest-exact, ...)."""
NAMED = WorkflowTemplate(
    "named",
    {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}_{{prompt}}", "images": ["2", 0]},
        },
    },
    {"prompt": Param("str"), "filename_prefix": Param("str", max_length=200)},
)
"""A template that puts the prompt into the file name."""


@dataclass(frozen=True)
class Shape:
    """A model's template and checkpoint (`images.ModelShape`)."""

    model_id: str
    template: WorkflowTemplate
    checkpoint: str | None


@dataclass
class Runner:
    output: Path
    client: httpx.AsyncClient
    manager: JobManager
    jobs: MemoryJobStore
    comfy: httpx.AsyncClient

    def post(self, body: dict[str, Any], **headers: str) -> Any:
        headers = {"X-Tenant-ID": "acme", **headers}
        return self.client.post("/v1/images/generations", json=body, headers=headers)

    async def prompts(self) -> int:
        """`POST /prompt` calls the fake ComfyUI has seen."""
        stats = (await self.comfy.get("/_fake/stats")).json()
        return int(stats["by_path"].get("/prompt", 0))


@pytest.fixture
async def runner(
    comfy: FakeEngine, comfy_dir: Path, http: httpx.AsyncClient
) -> AsyncIterator[Runner]:
    server = ComfyUIServer.attach(comfy.url, comfyui_path=str(comfy_dir))
    templates = {"coloured": COLOURED, "scaled": SCALED, "free": MODEL_FREE_TEST, "named": NAMED}
    engines = {name: ComfyUIEngine(name, server, t, timing=FAST) for name, t in templates.items()}
    for engine in engines.values():
        await engine.load()
    config = SchedulerConfig(model_concurrency=dict.fromkeys(engines, 1), unlisted_ready=False)
    admission = SchedulerAdmission(config)
    await admission.start()
    jobs = MemoryJobStore(time.time)
    manager = JobManager(jobs, None, "runner-1", time.time)
    tenants = TenantsConfig()
    front = FrontEnd(admission, RateLimiter(tenants), tenants, Metrics())
    generator = ImageGenerator(None, timing=FAST)
    facets = {name: ComfyImages(engine, generator) for name, engine in engines.items()}
    images = ImagesPath(front.gate, facets, None, 1 << 20, submit_job=job_submitter(manager))
    transport = httpx.ASGITransport(app=front.path(images.serve))
    async with httpx.AsyncClient(transport=transport, base_url="http://runner") as client:
        yield Runner(comfy_dir / "output", client, manager, jobs, http)
    await manager.aclose()
    await admission.stop()
    await server.stop()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "coloured", "prompt": "x", "x_seed": 16777216}, "seed must be at most 16777215"),
        ({"model": "scaled", "prompt": "bogus"}, "prompt must be one of 'nearest-exact'"),
        ({"model": "free", "prompt": "x", "x_seed": 5}, "does not take x_seed"),
    ],
    ids=["seed-beyond-color", "text-outside-choices", "x_seed-without-seed"],
)
async def test_images_input_comfyui_refuses_is_refused_before_the_202(
    runner: Runner, body: dict[str, Any], says: str
) -> None:
    """A seed beyond an input it feeds, a text outside a fixed choice, `x_seed` on a
    template without a seed: 400 naming it, sync and async alike, no job, nothing sent."""
    sent = await runner.prompts()
    sync = await runner.post(body)
    async_form = await runner.post(body, Prefer="respond-async")
    assert sync.status_code == async_form.status_code == 400, async_form.text
    assert says in async_form.json()["error"]["message"]
    assert async_form.json()["error"] == sync.json()["error"]
    assert len(runner.jobs) == 0
    assert await runner.prompts() == sent


async def test_images_without_x_seed_draw_a_seed_every_input_accepts(runner: Runner) -> None:
    """No `x_seed` on a template whose seed feeds `EmptyImage.color`: the drawn seed is
    within its bound, so the request succeeds (three times over, sync and async)."""
    for _ in range(3):
        response = await runner.post({"model": "coloured", "prompt": "x"})
        assert response.status_code == 200, response.text
    accepted = await runner.post({"model": "coloured", "prompt": "x"}, Prefer="respond-async")
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    await runner.manager.join(job_id)
    job = await runner.manager.get(job_id, "acme")
    assert job.status is JobStatus.SUCCEEDED, job.error


async def test_images_text_among_the_choices_reaches_comfyui(runner: Runner) -> None:
    """A text that is one of the input's choices is accepted and ComfyUI runs it (the fake
    ImageScale scales 8x8 to 16 wide, keeping the aspect)."""
    response = await runner.post({"model": "scaled", "prompt": "bilinear"})
    assert response.status_code == 200, response.text
    (item,) = response.json()["data"]
    assert png_size(base64.b64decode(item["b64_json"])) == (16, 16)


def test_images_seed_is_drawn_within_the_templates_seed_bounds() -> None:
    """The generator draws from the bounds the template's seed took on (0..16777215)."""
    asked: list[tuple[int, int]] = []

    def draw(low: int, high: int) -> int:
        asked.append((low, high))
        return high

    generator = ImageGenerator(None, seeds=draw)
    model = Shape("coloured", COLOURED, None)
    assert generator.seed_for(model, ImageRequest("coloured", "x")) == 0xFFFFFF
    assert generator.seed_for(model, ImageRequest("coloured", "x", seed=7)) == 7
    assert asked == [(0, 0xFFFFFF)]


@pytest.mark.parametrize(
    "prompt",
    ["../../../holiday/a cat", "../" * 12 + "evil", "x" * 5000],
    ids=["climbs-to-a-folder-of-its-own", "climbs-out-of-comfyuis-output", "too-long"],
)
async def test_images_prompt_in_the_file_name_names_no_folder(runner: Runner, prompt: str) -> None:
    """A template that puts the prompt into the file name: a prompt that climbs out of the
    job's folder (to one named after it, or out of ComfyUI's output folder, which ComfyUI
    refuses with an execution error) or is too long for a file name is a plain part of
    the name: 200, and nothing is left in ComfyUI's output folder."""
    response = await runner.post({"model": "named", "prompt": prompt})
    assert response.status_code == 200, response.text
    left = sorted(str(p.relative_to(runner.output)) for p in runner.output.rglob("*"))
    assert [p for p in left if p != "quorum"] == []


def test_template_putting_a_text_before_the_jobs_prefix_never_loads() -> None:
    """`{{prompt}}/{{filename_prefix}}` would make a folder named after each prompt in
    ComfyUI's output folder, outside the job's own: refused when the template loads."""
    graph = {
        **NAMED.graph,
        "3": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{prompt}}/{{filename_prefix}}", "images": ["2", 0]},
        },
    }
    with pytest.raises(ConfigError, match=r"puts \{\{prompt\}\} before \{\{filename_prefix\}\}"):
        WorkflowTemplate("early", graph, NAMED.params)
