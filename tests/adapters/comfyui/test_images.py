"""Image generation end to end against the fake ComfyUI: OpenAI's answer, progress, cancel."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.errors import ComfyUINotReady, ExecutionFailed
from adapters.comfyui.image_costs import image_work
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import TXT2IMG
from adapters.errors import InvalidImageRequest
from adapters.image_request import ImageRequest, parse_image_request
from adapters.image_store import ImageStore
from tests.adapters.comfyui.support import CHECKPOINT, FAST, png_size
from tests.fixtures.launch import FakeEngine
from tests.support.poll import eventually_async


class Reports:
    """A ProgressReporter that records what the work told it."""

    def __init__(self) -> None:
        self.running_calls = 0
        self.reports: list[tuple[float, float | None]] = []

    async def running(self) -> None:
        self.running_calls += 1

    async def report(self, done: float, total: float | None = None) -> None:
        self.reports.append((done, total))


@pytest.fixture
async def model(comfy: FakeEngine, comfy_dir: Path) -> AsyncIterator[ComfyUIEngine]:
    """The txt2img template on the test checkpoint, loaded on the fake ComfyUI."""
    server = ComfyUIServer.attach(comfy.url, comfyui_path=str(comfy_dir))
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT, timing=FAST)
    await engine.load()
    yield engine
    await server.stop()


def _request(**fields: object) -> ImageRequest:
    return parse_image_request({"model": "sd", "prompt": "a lighthouse", **fields})


async def test_generate_returns_b64_pngs_of_the_requested_size(model: ComfyUIEngine) -> None:
    """n=2 at 128x64: two base64 PNGs of that size, in OpenAI's `{created, data}` shape."""
    generator = ImageGenerator(timing=FAST, clock=lambda: 1_700_000_000.0)
    generated = await generator.generate(model, _request(n=2, size="128x64", x_steps=2))
    assert set(generated.body) == {"created", "data"}
    assert generated.body["created"] == 1_700_000_000
    assert len(generated.body["data"]) == 2
    for item in generated.body["data"]:
        assert set(item) == {"b64_json"}
        assert png_size(base64.b64decode(item["b64_json"])) == (128, 64)
    assert generated.engine_ms >= 0


async def test_generate_uses_a_fresh_folder_and_leaves_nothing_at_comfyui(
    model: ComfyUIEngine, comfy: FakeEngine, comfy_dir: Path
) -> None:
    """Each job saves into its own `quorum/<job>/` folder; once answered, its files and its
    ComfyUI history entry are gone."""
    generator = ImageGenerator(timing=FAST)
    first = await generator.generate(model, _request(x_seed=5))
    second = await generator.generate(model, _request(x_seed=5))
    assert first.prompt_id != second.prompt_id
    assert await model.client.history(first.prompt_id) is None
    bodies = [r["body"] for r in comfy.stats()["recent"] if r["path"] == "/prompt"]
    prefixes = [b["prompt"]["9"]["inputs"]["filename_prefix"] for b in bodies[-2:]]
    assert len(set(prefixes)) == 2
    assert all(re.fullmatch(r"quorum/[0-9a-f]{16}/img", p) for p in prefixes)
    assert list((comfy_dir / "output").rglob("*.png")) == []


async def test_generate_url_form_keeps_the_image(model: ComfyUIEngine, tmp_path: Path) -> None:
    """response_format=url: a runner path per image, served from the image store."""
    store = ImageStore(tmp_path / "images")
    generator = ImageGenerator(store, timing=FAST)
    generated = await generator.generate(model, _request(response_format="url", size="64x128"))
    (item,) = generated.body["data"]
    url = item["url"]
    assert url.startswith("/v1/images/files/") and url.endswith(".png")
    token = url.removeprefix("/v1/images/files/").removesuffix(".png")
    data = store.get(token)
    assert data is not None and png_size(data) == (64, 128)


async def test_generate_url_form_needs_a_store(model: ComfyUIEngine) -> None:
    """Without an image store a url answer cannot be kept: 400 before anything runs."""
    with pytest.raises(InvalidImageRequest, match="not enabled"):
        await ImageGenerator(timing=FAST).generate(model, _request(response_format="url"))


async def test_generate_reports_progress_up_to_done(model: ComfyUIEngine) -> None:
    """Progress goes to the job in workflow nodes, never backwards, ending complete."""
    reports = Reports()
    await ImageGenerator(timing=FAST).generate(model, _request(x_steps=4), reports.report)
    dones = [done for done, _ in reports.reports]
    assert dones == sorted(dones)
    assert reports.reports[-1] == (7.0, 7.0)
    assert any(0 < done < 7 for done in dones)


async def test_generate_execution_error_is_a_502_naming_the_node(model: ComfyUIEngine) -> None:
    """A node that raises at ComfyUI: 502 `comfyui_execution_error` with node and type."""
    request = parse_image_request({"model": "sd", "prompt": "[fake:execution_error]"})
    with pytest.raises(ExecutionFailed) as err:
        await ImageGenerator(timing=FAST).generate(model, request)
    assert err.value.status == 502
    assert "node 6 (CLIPTextEncode) raised RuntimeError" in str(err.value)


async def test_generate_cancelled_interrupts_the_prompt(model: ComfyUIEngine) -> None:
    """Cancelling the generation (client gone, job DELETE) interrupts it at ComfyUI."""
    reports = Reports()
    request = parse_image_request({"model": "sd", "prompt": "[fake:slow]", "x_steps": 50})
    task = asyncio.create_task(ImageGenerator(timing=FAST).generate(model, request, reports.report))

    async def sampling() -> bool:
        return any(done > 0 for done, _ in reports.reports[2:])

    await eventually_async(sampling)
    (prompt_id,) = (await model.client.queue()).running
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    async def interrupted() -> bool:
        entry = await model.client.history(prompt_id)
        return entry is not None and entry["status"]["messages"][-1][0] == "execution_interrupted"

    await eventually_async(interrupted)


async def test_generate_before_load_is_not_ready(comfy: FakeEngine) -> None:
    """A model that is not loaded answers 503 `comfyui_not_ready`."""
    server = ComfyUIServer.attach(comfy.url)
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT)
    with pytest.raises(ComfyUINotReady):
        await ImageGenerator().generate(engine, _request())
    await server.stop()


async def test_generate_hands_the_samplers_progress_to_the_slot(model: ComfyUIEngine) -> None:
    """The sampler's steps reach `sampling` as they come (what the wait forecast corrects
    the running prompt by), and the request's work is megapixels x steps x n."""
    seen: list[float] = []
    request = _request(size="64x128", x_steps=4, n=2)
    await ImageGenerator(timing=FAST).generate(model, request, sampling=seen.append)
    assert seen == [0.25, 0.5, 0.75, 1.0]
    assert image_work(TXT2IMG, request) == pytest.approx(2 * 64 * 128 * 4 / 1e6)
    assert image_work(TXT2IMG, _request()) == pytest.approx(512 * 512 * 20 / 1e6)
