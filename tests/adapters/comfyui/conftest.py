"""Fixtures: a fake ComfyUI subprocess per test module, and a client on it per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from adapters.comfyui.client import ComfyUIClient
from tests.adapters.comfyui.support import comfy_base
from tests.fixtures.launch import FakeEngine, start_fake


@pytest.fixture(scope="module")
def comfy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake's base directory (models/checkpoints, output)."""
    return comfy_base(tmp_path_factory.mktemp("comfyui"))


@pytest.fixture(scope="module")
def comfy(comfy_dir: Path) -> Iterator[FakeEngine]:
    """A fake ComfyUI; `[fake:slow]` sampler steps take 100 ms."""
    with start_fake(
        "fake_comfyui", "--base-directory", str(comfy_dir), "--slow-step-ms", "100"
    ) as engine:
        yield engine


@pytest.fixture
async def http(comfy: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=comfy.url, timeout=10.0, trust_env=False) as client:
        yield client


@pytest.fixture
def client(http: httpx.AsyncClient) -> ComfyUIClient:
    return ComfyUIClient(http)
