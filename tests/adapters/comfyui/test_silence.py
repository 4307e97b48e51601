"""The silence bound on a ComfyUI prompt (ENGINE_READ_TIMEOUT_S): nothing heard about it
for `silence_s` is a 504 `engine_timeout`, and ComfyUI is freed of it; against the fake
ComfyUI (a real subprocess), whose `[fake:hang]` node runs until interrupted, saying
nothing, as a real node without a progress hook does."""

from __future__ import annotations

import dataclasses

import pytest

from adapters.comfyui.client import ComfyUIClient, new_client_id
from adapters.comfyui.events import Event, about
from adapters.comfyui.follow import FollowTiming, run, silence, silent_past
from adapters.errors import EngineSilent
from tests.adapters.comfyui.support import FAST, eventually, txt2img

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

    await eventually(interrupted)
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

    await eventually(other_runs)
    with pytest.raises(EngineSilent) as caught:
        await run(client, txt2img("ours", "quorum/ours"), timing=_timing(0.5))
    assert "queue: removed" in str(caught.value)
    queue = await client.queue()
    assert queue.running == (other.prompt_id,) and queue.pending == ()
    await client.interrupt(other.prompt_id)

    async def other_interrupted() -> bool:
        return await _history_verdict(client, other.prompt_id) == "execution_interrupted"

    await eventually(other_interrupted)


@pytest.mark.timeout(30)
async def test_silence_progress_keeps_a_long_prompt_alive(client: ComfyUIClient) -> None:
    """A sampler's `progress` events reset the clock: a prompt that runs longer than
    `silence_s` in all (30 steps of 100 ms), but never that long without an event,
    succeeds."""
    graph = txt2img(f"patient {SLOW}", "quorum/patient", steps=30)
    finished = await run(client, graph, timing=_timing(1.5))
    assert finished.outcome.verdict == "success"
