"""The silence bound on a ComfyUI prompt (ENGINE_READ_TIMEOUT_S): nothing heard about it
for `silence_s` is a 504 `engine_timeout`, and ComfyUI is freed of it; against the fake
ComfyUI (a real subprocess), whose `[fake:hang]` node runs until interrupted, saying
nothing, as a real node without a progress hook does."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.comfyui.client import ComfyUIClient, new_client_id
from adapters.comfyui.engine import ComfyUIEngine
from adapters.comfyui.events import Event, about
from adapters.comfyui.follow import FollowTiming, run, silence, silent_past
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.server import ComfyUIServer
from adapters.comfyui.workflows import WorkflowTemplate, template_from_json
from adapters.errors import EngineSilent
from adapters.image_request import parse_image_request
from tests.adapters.comfyui.support import FAST, comfy_base, txt2img
from tests.fixtures.launch import FakeEngine, start_fake
from tests.support.poll import eventually_async

HANG = "[fake:hang]"
SLOW = "[fake:slow]"  # sampler steps of 100 ms (conftest)


def _timing(silence_s: float) -> FollowTiming:
    return dataclasses.replace(FAST, silence_s=silence_s)


async def _history_verdict(client: ComfyUIClient, prompt_id: str) -> str | None:
    entry = await client.history(prompt_id)
    if entry is None:
        return None
    return str(entry["status"]["messages"][-1][0])


def test_silence_clock_is_pure_arithmetic() -> None:
    """Silent past the bound exactly when `now - heard_at >= silence_s`."""
    assert not silent_past(100.0, 101.9, 2.0)
    assert silent_past(100.0, 102.0, 2.0)


def test_silence_error_is_a_504_engine_timeout_saying_what_was_done() -> None:
    """The error is `engine_timeout` (504) and says whether the prompt was interrupted or
    removed from ComfyUI's queue."""
    running = silence("p1", "running", 300.0)
    pending = silence("p2", "pending", 2.5)
    assert (running.status, running.code) == (504, "engine_timeout")
    assert type(running) is EngineSilent
    assert "300 s" in str(running) and "interrupted" in str(running)
    assert "2.5 s" in str(pending) and "queue: removed" in str(pending)


def test_silence_only_events_about_the_prompt_count() -> None:
    """Per-job events carry the prompt id and count as hearing from ComfyUI; `status`
    broadcasts and another prompt's events do not."""
    assert about(Event("progress_state", {"prompt_id": "p", "nodes": {}}), "p")
    assert about(Event("progress", {"prompt_id": "p", "value": 1, "max": 3}), "p")
    assert not about(Event("status", {"status": {"exec_info": {"queue_remaining": 1}}}), "p")
    assert not about(Event("executing", {"node": "4", "prompt_id": "q"}), "p")


@pytest.mark.timeout(30)
async def test_silence_running_prompt_is_504_and_interrupted(client: ComfyUIClient) -> None:
    """A node that says nothing for `silence_s`: EngineSilent (504 `engine_timeout`), and
    the prompt was interrupted at ComfyUI (history: `execution_interrupted`), so ComfyUI
    runs nothing any more."""
    with pytest.raises(EngineSilent) as caught:
        await run(client, txt2img(f"a kite {HANG}", "quorum/hang"), timing=_timing(0.5))
    assert "interrupted" in str(caught.value)
    prompt_id = str(caught.value).split("prompt ")[1].split(" ")[0]

    async def interrupted() -> bool:
        return await _history_verdict(client, prompt_id) == "execution_interrupted"

    await eventually_async(interrupted)
    assert (await client.queue()).depth == 0


@pytest.mark.timeout(30)
async def test_silence_pending_prompt_is_removed_from_comfyuis_queue(
    client: ComfyUIClient,
) -> None:
    """Our prompt waits in ComfyUI's queue behind another client's that never ends: after
    `silence_s` it is a 504 and removed from the queue (`POST /queue {delete}`); the
    other client's prompt is not touched (a targeted interrupt is a no-op for it)."""
    other = await client.submit(txt2img(f"not ours {HANG}", "quorum/other"), new_client_id())

    async def other_runs() -> bool:
        return (await client.queue()).running == (other.prompt_id,)

    await eventually_async(other_runs)
    with pytest.raises(EngineSilent) as caught:
        await run(client, txt2img("ours", "quorum/ours"), timing=_timing(0.5))
    assert "queue: removed" in str(caught.value)
    queue = await client.queue()
    assert queue.running == (other.prompt_id,) and queue.pending == ()
    await client.interrupt(other.prompt_id)

    async def other_interrupted() -> bool:
        return await _history_verdict(client, other.prompt_id) == "execution_interrupted"

    await eventually_async(other_interrupted)


@pytest.mark.timeout(30)
async def test_silence_progress_keeps_a_long_prompt_alive(client: ComfyUIClient) -> None:
    """A sampler's `progress` events reset the clock: a prompt that runs longer than
    `silence_s` in all (30 steps of 100 ms), but never that long without an event,
    succeeds."""
    graph = txt2img(f"patient {SLOW}", "quorum/patient", steps=30)
    finished = await run(client, graph, timing=_timing(1.5))
    assert finished.outcome.verdict == "success"


BLUR_MS = 1500  # one ImageBlur: no progress hook, no interrupt check inside it


def two_blurs() -> WorkflowTemplate:
    """EmptyImage -> ImageBlur -> ImageBlur -> SaveImage: silent for each blur, and an
    interrupt acts only after the blur that runs (the shape checked on the real ComfyUI).
    The seed is the colour, so each request's nodes miss ComfyUI's node cache."""
    graph = {
        "1": {"class_type": "EmptyImage",
              "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": "{{seed}}"}},
        "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 3,
                                                    "sigma": 1.0}},
        "3": {"class_type": "ImageBlur", "inputs": {"image": ["2", 0], "blur_radius": 3,
                                                    "sigma": 1.0}},
        "4": {"class_type": "SaveImage",
              "inputs": {"images": ["3", 0], "filename_prefix": "{{filename_prefix}}"}},
    }  # fmt: skip
    return template_from_json(
        {
            "name": "blurs",
            "graph": graph,
            "params": {
                "filename_prefix": {"type": "str"},
                "seed": {"type": "int", "default": 0, "min": 0, "max": 0xFFFFFF},
            },
        }
    )


@pytest.fixture(scope="module")
def blurring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeEngine]:
    """A fake ComfyUI whose ImageBlur takes BLUR_MS."""
    base = comfy_base(tmp_path_factory.mktemp("blur"))
    with start_fake(
        "fake_comfyui", "--base-directory", str(base), "--blur-ms", str(BLUR_MS)
    ) as engine:
        yield engine


@pytest.fixture
async def blurs(blurring: FakeEngine) -> AsyncIterator[ComfyUIEngine]:
    server = ComfyUIServer.attach(blurring.url)
    engine = ComfyUIEngine("blurs", server, two_blurs(), timing=FAST)
    await engine.load()
    yield engine
    await server.stop()


@pytest.mark.timeout(30)
async def test_silence_504_waits_until_comfyui_lets_go_of_the_prompt(
    blurs: ComfyUIEngine,
) -> None:
    """Silent inside a blur: the 504 comes once ComfyUI acted on the interrupt (after
    that blur, before the next node), so the slot it frees finds ComfyUI idle."""
    generator = ImageGenerator(timing=_timing(0.5), settle_poll_s=0.05)
    request = parse_image_request({"model": "blurs", "prompt": "x", "x_seed": 1})
    with pytest.raises(EngineSilent):
        await generator.generate(blurs, request)
    assert (await blurs.client.queue()).depth == 0

    async def cleaned_up() -> bool:
        return not generator._cleanups

    await eventually_async(cleaned_up)


@pytest.mark.timeout(30)
async def test_silence_waits_for_comfyui_at_most_release_s(blurs: ComfyUIEngine) -> None:
    """A prompt ComfyUI does not let go of within `release_s`: the 504 comes anyway, the
    prompt still running at ComfyUI (its node has not returned)."""
    generator = ImageGenerator(timing=_timing(0.3), settle_poll_s=0.05, release_s=0.1)
    request = parse_image_request({"model": "blurs", "prompt": "x", "x_seed": 2})
    with pytest.raises(EngineSilent):
        await generator.generate(blurs, request)
    assert len((await blurs.client.queue()).running) == 1

    async def cleaned_up() -> bool:  # the prompt ended at ComfyUI; its files are removed
        return (await blurs.client.queue()).depth == 0 and not generator._cleanups

    await eventually_async(cleaned_up)
