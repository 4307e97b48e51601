"""The ComfyUI client and follower against the fake ComfyUI (a real subprocess)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import pytest

from adapters.comfyui.client import ComfyUIClient, new_client_id, new_prompt_id
from adapters.comfyui.errors import WorkflowPartlyRejected, WorkflowRejected
from adapters.comfyui.events import JobView
from adapters.comfyui.follow import FollowTiming, run
from adapters.comfyui.workflows import MODEL_FREE_TEST
from adapters.errors import EngineBadResponse, EngineUnavailable
from tests.adapters.comfyui.support import (
    CHECKPOINT,
    FAST,
    fake_state,
    model_free,
    png_size,
    txt2img,
)
from tests.support.poll import eventually_async

SLOW = "[fake:slow]"  # sampler steps of 100 ms


@contextlib.asynccontextmanager
async def running_slow(client: ComfyUIClient, steps: int = 50) -> AsyncIterator[str]:
    """A slow prompt running at ComfyUI (its id), stopped when the block ends."""
    seen = asyncio.Event()

    async def on_view(view: JobView) -> None:
        if view.step is not None:
            seen.set()

    graph = txt2img(f"slow {SLOW}", "quorum/slow", steps=steps)
    task = asyncio.create_task(run(client, graph, on_view, FAST))
    await asyncio.wait_for(seen.wait(), 10)
    queue = await client.queue()
    try:
        yield queue.running[0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_client_runs_a_model_free_workflow_to_a_png(client: ComfyUIClient) -> None:
    """EmptyImage -> ImageInvert -> SaveImage runs; the saved file is a PNG of that size."""
    views: list[JobView] = []

    async def on_view(view: JobView) -> None:
        views.append(view)

    finished = await run(client, model_free("quorum/mf", width=48, height=24), on_view, FAST)
    assert finished.outcome.verdict == "success"
    (image,) = finished.outcome.images
    assert image.subfolder == "quorum" and image.filename.startswith("mf_")
    assert png_size(await client.view(image)) == (48, 24)
    assert views[-1].ended
    assert views[-1].progress(MODEL_FREE_TEST.node_count) == (3.0, 3.0)


async def test_client_follows_txt2img_sampler_progress(client: ComfyUIClient) -> None:
    """Sampler steps arrive as `progress` events and move the view's progress."""
    steps: list[tuple[float, float]] = []

    async def on_view(view: JobView) -> None:
        if view.step is not None:
            steps.append(view.step)

    finished = await run(
        client, txt2img("a cat", "quorum/t2i", steps=4, batch_size=2), on_view, FAST
    )
    assert finished.outcome.verdict == "success"
    assert steps == [(1.0, 4.0), (2.0, 4.0), (3.0, 4.0), (4.0, 4.0)]
    assert len(finished.outcome.images) == 2
    for image in finished.outcome.images:
        assert png_size(await client.view(image)) == (64, 64)


async def test_client_400_becomes_workflow_rejected_with_node_errors(
    client: ComfyUIClient,
) -> None:
    """A checkpoint ComfyUI does not list: 400 with `value_not_in_list` on that node."""
    with pytest.raises(WorkflowRejected) as err:
        await run(client, txt2img("x", "quorum/r", checkpoint="missing.safetensors"), timing=FAST)
    assert err.value.status == 400
    assert err.value.error_type == "prompt_outputs_failed_validation"
    assert "node 4 (CheckpointLoaderSimple): value_not_in_list" in str(err.value)
    assert "missing.safetensors" in str(err.value)
    errors = err.value.node_errors["4"]["errors"]
    assert errors[0]["type"] == "value_not_in_list"


async def test_client_unknown_node_is_missing_node_type(client: ComfyUIClient) -> None:
    """A class ComfyUI does not have: 400 `missing_node_type` (v0.38+)."""
    graph = model_free("quorum/u")
    graph["2"]["class_type"] = "NoSuchNode"
    with pytest.raises(WorkflowRejected) as err:
        await client.submit(graph, new_client_id())
    assert err.value.error_type == "missing_node_type"
    assert "NoSuchNode" in str(err.value)


async def test_client_200_with_node_errors_fails_and_removes_the_prompt(
    client: ComfyUIClient, http: httpx.AsyncClient
) -> None:
    """One output invalid, one valid: ComfyUI answers 200 with node_errors; that is a
    failure, and the prompt it queued anyway is deleted and interrupted."""
    graph = model_free("quorum/partly")
    bad_size = {"width": 0, "height": 8, "batch_size": 1, "color": 0}
    graph["4"] = {"class_type": "EmptyImage", "inputs": bad_size}
    save = {"images": ["4", 0], "filename_prefix": "quorum/bad"}
    graph["5"] = {"class_type": "SaveImage", "inputs": save}
    await http.post("/_fake/reset")
    with pytest.raises(WorkflowPartlyRejected) as err:
        await client.submit(graph, new_client_id())
    assert err.value.status == 400
    assert "node 4 (EmptyImage): value_smaller_than_min" in str(err.value)
    recent = (await http.get("/_fake/stats")).json()["recent"]
    prompt_id = next(r["body"]["prompt_id"] for r in recent if r["path"] == "/prompt")
    assert {"path": "/queue", "delete": [prompt_id]} in [
        {"path": r["path"], "delete": r["body"].get("delete")} for r in recent
    ]
    assert {"prompt_id": prompt_id} in [r["body"] for r in recent if r["path"] == "/interrupt"]

    async def gone() -> bool:
        queue = await client.queue()
        return prompt_id not in queue.pending and prompt_id not in queue.running

    await eventually_async(gone)


async def test_client_retries_a_duplicate_prompt_id_with_a_fresh_one(
    client: ComfyUIClient,
) -> None:
    """v0.38+ answers 409 to a known prompt id; the client sends once more with a new id."""
    prompt_id = new_prompt_id()
    first = await client.submit(model_free("quorum/d1"), new_client_id(), prompt_id)
    second = await client.submit(model_free("quorum/d2"), new_client_id(), prompt_id)
    assert first.prompt_id == prompt_id
    assert second.prompt_id != prompt_id


async def test_follow_ends_from_history_when_the_websocket_drops(
    client: ComfyUIClient, http: httpx.AsyncClient
) -> None:
    """The websocket is cut mid-job and never reopened: /history still ends it correctly."""
    drops = (await fake_state(http))["ws_drops"]
    timing = FollowTiming(safety_poll_s=0.2, fallback_poll_s=0.05, reopen_after_s=60.0)
    graph = txt2img("a boat [fake:drop_ws]", "quorum/drop", width=128, height=64)
    finished = await run(client, graph, timing=timing)
    assert (await fake_state(http))["ws_drops"] == drops + 1
    assert not finished.view.ended  # the end marker never arrived
    assert finished.outcome.verdict == "success"
    assert png_size(await client.view(finished.outcome.images[0])) == (128, 64)


async def test_follow_reopens_a_dropped_websocket(
    client: ComfyUIClient, http: httpx.AsyncClient
) -> None:
    """A dropped websocket is reopened with the same clientId and the job still ends."""
    connects = (await fake_state(http))["ws_connects"]
    graph = txt2img(f"a boat [fake:drop_ws] {SLOW}", "quorum/reopen", steps=5)
    finished = await run(client, graph, timing=FAST)
    assert finished.outcome.verdict == "success"
    assert (await fake_state(http))["ws_connects"] >= connects + 2


async def test_follow_survives_a_websocket_that_goes_silent(client: ComfyUIClient) -> None:
    """A websocket that stays open but sends nothing: the safety poll of /history ends it."""
    finished = await run(client, txt2img("a boat [fake:hang_ws]", "quorum/hang"), timing=FAST)
    assert finished.outcome.verdict == "success"
    assert not finished.view.ended


async def test_execution_error_names_the_node(client: ComfyUIClient) -> None:
    """A node that raises: `execution_error` with its node, class and exception."""
    graph = txt2img("[fake:execution_error]", "quorum/err")
    finished = await run(client, graph, timing=FAST)
    assert finished.outcome.verdict == "error"
    failure = finished.outcome.failure
    assert failure is not None
    assert (failure.node_id, failure.node_type, failure.exception_type) == (
        "6",
        "CLIPTextEncode",
        "RuntimeError",
    )
    assert finished.outcome.images == ()


async def test_interrupt_stops_the_running_prompt(client: ComfyUIClient) -> None:
    """The targeted /interrupt ends the running prompt as `interrupted` in its history."""
    seen = asyncio.Event()

    async def on_view(view: JobView) -> None:
        if view.step is not None:
            seen.set()

    task = asyncio.create_task(run(client, txt2img(SLOW, "quorum/int", steps=50), on_view, FAST))
    await asyncio.wait_for(seen.wait(), 10)
    (prompt_id,) = (await client.queue()).running
    await client.interrupt(prompt_id)
    finished = await asyncio.wait_for(task, 10)
    assert finished.outcome.verdict == "interrupted"


async def test_cancelling_a_run_interrupts_it_at_comfyui(client: ComfyUIClient) -> None:
    """Cancelling the follower (client gone, job cancelled) interrupts the prompt."""
    async with running_slow(client) as prompt_id:
        pass  # leaving the block cancels the run

    async def interrupted() -> bool:
        entry = await client.history(prompt_id)
        return entry is not None and entry["status"]["messages"][-1][0] == "execution_interrupted"

    await eventually_async(interrupted)


async def test_queue_shows_running_and_pending_and_cancel_removes_a_pending_prompt(
    client: ComfyUIClient,
) -> None:
    """/queue lists the running prompt and the pending one; cancel removes the pending one
    without touching the running one."""
    async with running_slow(client) as running_id:
        pending = await client.submit(model_free("quorum/pending"), new_client_id())
        queue = await client.queue()
        assert queue.running == (running_id,)
        assert queue.pending == (pending.prompt_id,)
        assert queue.depth == 2
        await client.cancel(pending.prompt_id)
        queue = await client.queue()
        assert queue.pending == () and queue.running == (running_id,)
    assert await client.history(pending.prompt_id) is None


async def test_free_unloads_models_as_system_stats_shows(client: ComfyUIClient) -> None:
    """A txt2img run loads the checkpoint (less free memory); /free gives it back."""
    await run(client, txt2img("load it", "quorum/mem"), timing=FAST)
    loaded = await client.system_stats()
    device = loaded.primary
    assert device is not None and device.type == "cuda"
    assert device.vram_free == device.vram_total - 2048 * 1024 * 1024
    await client.free(unload_models=True, free_memory=True)

    async def freed() -> bool:
        d = (await client.system_stats()).primary
        return d is not None and d.vram_free == d.vram_total

    await eventually_async(freed)


async def test_models_lists_checkpoints(client: ComfyUIClient) -> None:
    """/models/checkpoints lists the files in models/checkpoints; an unknown folder: []."""
    assert await client.models("checkpoints") == [CHECKPOINT]
    assert await client.models("no_such_folder") == []


async def test_view_of_a_missing_image_is_a_bad_response(client: ComfyUIClient) -> None:
    """/view answers 404 for a file that is not there; the client says so (502)."""
    from adapters.comfyui.events import ImageRef

    with pytest.raises(EngineBadResponse, match="404"):
        await client.view(ImageRef("nothing_00001_.png", "quorum"))


async def test_unreachable_comfyui_is_engine_unavailable() -> None:
    """Nothing listening: the runner's 502 `engine_unavailable`, not an httpx exception."""
    from tests.support.ports import free_port

    url = f"http://127.0.0.1:{free_port()}"
    async with httpx.AsyncClient(base_url=url, trust_env=False) as http:
        with pytest.raises(EngineUnavailable):
            await ComfyUIClient(http).queue()
