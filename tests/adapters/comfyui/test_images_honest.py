"""Image generation leaves nothing behind and tells the truth when ComfyUI dies: the job's
files removed from ComfyUI's output folder, the runner's own copies after their TTL, no
workflow in the PNGs unless asked, a crash reported as the engine's crash."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.errors import ExecutionFailed
from adapters.comfyui.images import ImageGenerator, without_text_chunks
from adapters.comfyui.server import ComfyUIServer, job_folders, output_folder
from adapters.comfyui.workflows import TXT2IMG, WorkflowTemplate, template_from_json
from adapters.errors import EngineCrashed
from adapters.image_request import parse_image_request
from adapters.image_store import ImageStore
from tests.adapters.comfyui.support import CHECKPOINT, FAST, stub_comfyui
from tests.fixtures._comfy_nodes import png
from tests.fixtures._comfy_probe import png_chunks, png_text
from tests.fixtures.launch import FakeEngine
from tests.support.poll import eventually_async


@pytest.fixture
async def model(comfy: FakeEngine, comfy_dir: Path) -> AsyncIterator[ComfyUIEngine]:
    """txt2img on the fake ComfyUI (which writes the graph into each PNG, as ComfyUI does)."""
    server = ComfyUIServer.attach(comfy.url)
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT, timing=FAST)
    await engine.load()
    yield engine
    await server.stop()


def _pngs(folder: Path) -> list[Path]:
    return sorted((folder / "output").rglob("*.png"))


def _request(prompt: str = "a private lighthouse", **fields: object) -> object:
    return parse_image_request({"model": "sd", "prompt": prompt, **fields})


async def test_generate_removes_the_jobs_files_from_comfyuis_output(
    model: ComfyUIEngine, comfy_dir: Path
) -> None:
    """ComfyUI keeps every saved file; the runner removes the job's folder once the answer
    is read (the output folder found from the attached ComfyUI's own argv)."""
    before = _pngs(comfy_dir)
    await ImageGenerator(timing=FAST).generate(model, _request(n=2))
    assert _pngs(comfy_dir) == before == []


async def test_generate_answers_pngs_without_the_workflow(model: ComfyUIEngine) -> None:
    """The PNGs ComfyUI wrote carry the whole graph, prompt included; the answer's do not,
    unless the operator keeps the metadata."""
    request = _request("a private lighthouse")
    plain = await ImageGenerator(timing=FAST).generate(model, request)
    image = base64.b64decode(plain.body["data"][0]["b64_json"])
    assert [k for k, _ in png_chunks(image)] == [b"IHDR", b"IDAT", b"IEND"]
    kept = await ImageGenerator(timing=FAST, keep_metadata=True).generate(model, request)
    text = png_text(base64.b64decode(kept.body["data"][0]["b64_json"]))
    assert "a private lighthouse" in text["prompt"]


async def test_generate_url_copy_is_removed_after_its_ttl(
    model: ComfyUIEngine, comfy_dir: Path, tmp_path: Path
) -> None:
    """response_format=url: ComfyUI's file goes at once; the runner's own copy is removed
    from disk when IMAGES_URL_TTL_S has passed, not at the next sweep."""
    store = ImageStore(tmp_path / "images", ttl_s=0.3)
    generated = await ImageGenerator(store, timing=FAST).generate(
        model, _request(response_format="url")
    )
    assert generated.body["data"][0]["url"].startswith("/v1/images/files/")
    assert _pngs(comfy_dir) == []
    assert len(list(store.directory.glob("*.png"))) == 1

    async def gone() -> bool:
        return list(store.directory.glob("*.png")) == []

    await eventually_async(gone, 5)


async def test_generate_failed_after_saving_still_removes_the_files(
    comfy: FakeEngine, comfy_dir: Path
) -> None:
    """A workflow whose first output saved images and whose second raised: the request
    fails, and the saved images are removed all the same."""
    server = ComfyUIServer.attach(comfy.url)
    engine = ComfyUIEngine("two", server, two_outputs("ok"), timing=FAST)
    try:
        await engine.load()
        engine.template = two_outputs("[fake:execution_error]")
        with pytest.raises(ExecutionFailed):
            await ImageGenerator(timing=FAST).generate(engine, _request())

        async def removed() -> bool:
            return _pngs(comfy_dir) == []

        await eventually_async(removed, 5)
    finally:
        await server.stop()


def two_outputs(mark: str) -> WorkflowTemplate:
    """EmptyImage saved as is (node 2), then inverted and saved under a prefix with `mark`
    (node 4): the fake's failure marker makes node 4 raise after node 2 saved."""
    empty = {"width": 8, "height": 8, "batch_size": 1, "color": 0}
    graph = {
        "1": {"class_type": "EmptyImage", "inputs": empty},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}},
        "3": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0]}},
    }
    graph["2"]["inputs"]["filename_prefix"] = "{{filename_prefix}}"
    graph["4"]["inputs"]["filename_prefix"] = f"{{{{filename_prefix}}}}-{mark}"
    return template_from_json(
        {"name": "two", "graph": graph, "params": {"filename_prefix": {"type": "str"}}}
    )


async def test_generate_cancelled_removes_the_files_once_comfyui_stops_the_prompt(
    model: ComfyUIEngine, comfy_dir: Path
) -> None:
    """A cancelled job's prompt may still run a node at ComfyUI (interrupts act between
    nodes): its folder is removed once ComfyUI no longer runs it."""
    generator = ImageGenerator(timing=FAST, settle_poll_s=0.05)
    request = _request("[fake:slow]", x_steps=6)
    task = asyncio.create_task(generator.generate(model, request))

    async def running() -> bool:
        return bool((await model.client.queue()).running)

    await eventually_async(running)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def settled() -> bool:
        idle = (await model.client.queue()).depth == 0
        return idle and not generator._cleanups and _pngs(comfy_dir) == []

    await eventually_async(settled)


async def test_generate_crash_mid_prompt_is_the_engines_crash(tmp_path: Path) -> None:
    """ComfyUI (spawned) SIGKILLed while a prompt runs and another waits in its queue: both
    requests fail with `engine_crashed` naming the signal, not a connection error."""
    server = ComfyUIServer.spawn(str(stub_comfyui(tmp_path)), python=sys.executable)
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT, timing=FAST)
    await engine.load()
    generator = ImageGenerator(timing=FAST)
    try:
        slow = _request("[fake:slow]", x_steps=50)
        running = asyncio.create_task(generator.generate(engine, slow))
        queued = asyncio.create_task(generator.generate(engine, slow))

        async def both_at_comfyui() -> bool:
            queue = await engine.client.queue()
            return len(queue.running) == 1 and len(queue.pending) == 1

        await eventually_async(both_at_comfyui)
        assert server.process is not None and server.process.pid is not None
        os.killpg(server.process.pid, signal.SIGKILL)
        for task in (running, queued):
            with pytest.raises(EngineCrashed) as err:
                await task
            assert err.value.status == 502 and err.value.code == "engine_crashed"
            assert "SIGKILL" in str(err.value) and "exit code -9" in str(err.value)
    finally:
        await server.stop()


async def test_spawned_comfyui_writes_no_metadata_unless_asked(tmp_path: Path) -> None:
    """The runner starts ComfyUI with `--disable-metadata`, except when metadata is kept."""
    root = str(stub_comfyui(tmp_path))
    plain, kept = ComfyUIServer.spawn(root), ComfyUIServer.spawn(root, metadata=True)
    try:
        assert plain.process is not None and kept.process is not None
        assert plain.process.argv[-1] == "--disable-metadata"
        assert "--disable-metadata" not in kept.process.argv
        assert plain.output_dir == Path(root) / "output"
    finally:
        await plain.stop()
        await kept.stop()


async def test_discard_touches_only_job_folders(comfy: FakeEngine, comfy_dir: Path) -> None:
    """`discard` removes `quorum/<16 hex>` folders inside the output folder, nothing else."""
    server = ComfyUIServer.attach(comfy.url)
    await server.start()
    output = comfy_dir / "output"
    keep = output / "mine" / "a.png"
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_bytes(b"x")
    job = output / "quorum" / "0123456789abcdef"
    job.mkdir(parents=True, exist_ok=True)
    (job / "img_00001_.png").write_bytes(b"x")
    try:
        assert not await server.discard("mine")
        assert not await server.discard("../..")
        assert not await server.discard("quorum/../mine")
        assert await server.discard("quorum/0123456789abcdef")
        assert keep.exists() and not job.exists()
    finally:
        keep.unlink()
        await server.stop()


def test_output_folder_follows_comfyuis_argv() -> None:
    """--output-directory wins, then --base-directory/output, then COMFYUI_PATH/output;
    relative paths (ComfyUI's working directory unknown) and nothing: unknown."""
    out = ["main.py", "--output-directory", "/data/out", "--base-directory", "/b"]
    assert output_folder(out, "/c") == Path("/data/out")
    assert output_folder(["main.py", "--base-directory", "/b"], "/c") == Path("/b/output")
    assert output_folder(["main.py"], "/c") == Path("/c/output")
    assert output_folder(["main.py", "--output-directory", "out"], "/c") is None
    assert output_folder(["main.py"], None) is None


def test_job_folders_are_the_prefix_folders_ending_in_the_token() -> None:
    """Every SaveImage prefix's folder up to the job token; prefixes without it: none."""
    token = "0123456789abcdef"
    graph = {
        "1": {"class_type": "SaveImage", "inputs": {"filename_prefix": f"quorum/{token}/img"}},
        "2": {"class_type": "SaveImage", "inputs": {"filename_prefix": f"out/quorum/{token}/x"}},
        "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": "fixed/name"}},
    }
    assert job_folders(graph, token) == {f"quorum/{token}", f"out/quorum/{token}"}


def test_without_text_chunks_keeps_the_image_and_drops_the_text() -> None:
    """tEXt chunks go, the rest stays byte for byte; what is not a PNG is left alone."""
    texted = png(4, 2, (1, 2, 3), {"prompt": '{"6": "a secret"}', "workflow": "{}"})
    assert without_text_chunks(texted) == png(4, 2, (1, 2, 3))
    assert without_text_chunks(b"not a png") == b"not a png"
    assert without_text_chunks(texted[:-5]) == texted[:-5]
