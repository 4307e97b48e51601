"""ComfyUIEngine: spawn or attach, load (checkpoint + warm-up), unload (/free), status."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.base import FlushScope
from adapters.comfyui.engine import NO_KV_CACHE, ComfyModelState, ComfyUIEngine
from adapters.comfyui.errors import ComfyUINotReady
from adapters.comfyui.follow import run
from adapters.comfyui.server import ComfyUIServer, command_line
from adapters.comfyui.workflows import MODEL_FREE_TEST, TXT2IMG
from adapters.errors import EngineStartFailed, IllegalEngineTransition, UnsupportedRequest
from tests.adapters.comfyui.support import CHECKPOINT, FAST, stub_comfyui, txt2img
from tests.fixtures.launch import FakeEngine
from tests.support.poll import eventually_async


def state(engine: ComfyUIEngine) -> ComfyModelState:
    """The engine's state, read afresh (not narrowed by an earlier assert)."""
    return engine.state


@contextlib.asynccontextmanager
async def attached(comfy: FakeEngine, comfy_dir: Path) -> AsyncIterator[ComfyUIServer]:
    server = ComfyUIServer.attach(comfy.url, comfyui_path=str(comfy_dir))
    try:
        yield server
    finally:
        await server.stop()


def test_command_line_is_comfyuis_own() -> None:
    """main.py from COMFYUI_PATH, bound to loopback on the given port, --cpu when asked."""
    assert command_line("/venv/bin/python", "/opt/comfyui", 8190, cpu=True) == [
        "/venv/bin/python",
        "/opt/comfyui/main.py",
        "--listen",
        "127.0.0.1",
        "--port",
        "8190",
        "--disable-auto-launch",
        "--cpu",
    ]
    assert "--cpu" not in command_line("python", "/c", 1)


async def test_engine_spawns_loads_reports_and_unloads(tmp_path: Path) -> None:
    """Spawned ComfyUI: load warms the checkpoint up (memory taken), unload calls /free and
    reports the memory /system_stats shows after."""
    server = ComfyUIServer.spawn(str(stub_comfyui(tmp_path)), python=sys.executable)
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT, timing=FAST)
    try:
        report = await engine.load()
        assert state(engine) is ComfyModelState.LOADED
        assert server.process is not None and server.process.pid is not None
        assert (report.checkpoint, report.fetched) == (CHECKPOINT, False)
        assert report.memory.total_mb - report.memory.free_mb == 2048  # the warm-up loaded it
        status = await engine.status()
        assert status.to_json()["queueDepth"] == 0
        unload = await engine.unload()
        assert state(engine) is ComfyModelState.UNLOADED
        assert (unload.before.free_mb, unload.after.free_mb) == (6144, 8192)
        assert unload.freed_mb == 2048
        assert unload.to_json()["memoryFreedMB"] == 2048
        assert any("READY" in line for line in server.process.logs())
    finally:
        await server.stop()
    assert server.process.exit is not None and server.process.exit.expected


async def test_engine_spawn_failure_fails_the_load(tmp_path: Path) -> None:
    """A COMFYUI_PATH without main.py: the start fails with the process's exit, FAILED."""
    server = ComfyUIServer.spawn(str(tmp_path), python=sys.executable, load_timeout_s=20)
    engine = ComfyUIEngine("sd", server, TXT2IMG, CHECKPOINT, timing=FAST)
    with pytest.raises(EngineStartFailed, match="exited while starting"):
        await engine.load()
    assert state(engine) is ComfyModelState.FAILED
    await server.stop()


async def test_engine_fetches_a_missing_checkpoint_into_the_folder(
    comfy: FakeEngine, comfy_dir: Path
) -> None:
    """A checkpoint ComfyUI does not list is fetched into models/checkpoints, then used."""
    fetched: list[tuple[str, Path]] = []

    async def fetch(name: str, folder: Path) -> None:
        fetched.append((name, folder))
        (folder / name).write_bytes(b"downloaded")

    async with attached(comfy, comfy_dir) as server:
        engine = ComfyUIEngine("xl", server, TXT2IMG, "xl.safetensors", fetch=fetch, timing=FAST)
        report = await engine.load()
        assert report.fetched
        assert fetched == [("xl.safetensors", comfy_dir / "models" / "checkpoints")]
        assert "xl.safetensors" in await server.client.models("checkpoints")


async def test_engine_without_fetch_refuses_a_missing_checkpoint(
    comfy: FakeEngine, comfy_dir: Path
) -> None:
    """No fetch hook: the load fails naming the checkpoint; a later load may try again."""
    async with attached(comfy, comfy_dir) as server:
        engine = ComfyUIEngine("gone", server, TXT2IMG, "gone.safetensors", timing=FAST)
        with pytest.raises(ComfyUINotReady, match=r"gone\.safetensors"):
            await engine.load()
        assert state(engine) is ComfyModelState.FAILED
        (comfy_dir / "models" / "checkpoints" / "gone.safetensors").write_bytes(b"w")
        await engine.load()
        assert state(engine) is ComfyModelState.LOADED


async def test_engine_status_shows_queue_depth_and_the_running_prompt(
    comfy: FakeEngine, comfy_dir: Path
) -> None:
    """Capabilities read ComfyUI's /queue: depth, and which prompt runs."""
    async with attached(comfy, comfy_dir) as server:
        engine = ComfyUIEngine("t", server, MODEL_FREE_TEST, timing=FAST)
        await engine.load()
        task = asyncio.create_task(
            run(server.client, txt2img("[fake:slow]", "quorum/busy", steps=50), timing=FAST)
        )
        try:

            async def busy() -> bool:
                return bool((await server.client.queue()).running)

            await eventually_async(busy)
            status = (await engine.status()).to_json()
            assert status["queueDepth"] == 1 and status["queueRunning"] == 1
            assert status["runningPromptId"] == (await server.client.queue()).running[0]
            assert status["gpuMemoryTotalMB"] == 8192
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_engine_flush_says_there_is_no_kv_cache(comfy: FakeEngine, comfy_dir: Path) -> None:
    """A cache flush on a ComfyUI model answers `flushed: false` with the reason."""
    async with attached(comfy, comfy_dir) as server:
        engine = ComfyUIEngine("t", server, MODEL_FREE_TEST)
        result = await engine.flush(FlushScope("tenant", tenant_id="acme"))
        assert (result.flushed, result.reason) == (False, NO_KV_CACHE)


async def test_engine_refuses_chat_requests_and_unloaded_use(
    comfy: FakeEngine, comfy_dir: Path
) -> None:
    """Chat/completions for an image model are a 400; generation before load a 503;
    unloading a model that is not loaded is a bug the state table refuses."""
    async with attached(comfy, comfy_dir) as server:
        engine = ComfyUIEngine("t", server, MODEL_FREE_TEST)
        with pytest.raises(UnsupportedRequest, match="/v1/images/generations"):
            engine.rewrite({"model": "t", "messages": []}, "auto", "acme")
        with pytest.raises(ComfyUINotReady, match="unloaded"):
            engine.ensure_ready()
        with pytest.raises(IllegalEngineTransition):
            await engine.unload()
