"""Helpers shared by the ComfyUI adapter tests."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import httpx

from adapters.comfyui.follow import FollowTiming
from adapters.comfyui.workflows import MODEL_FREE_TEST, TXT2IMG
from tests.fixtures.launch import REPO_ROOT

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHECKPOINT = "sd15.safetensors"
FAST = FollowTiming(safety_poll_s=0.2, fallback_poll_s=0.05, reopen_after_s=0.1, max_reopen=5)
"""Polling fast enough for tests; nothing waits on it except when a websocket fails."""


def comfy_base(root: Path) -> Path:
    """A ComfyUI base directory with one checkpoint in models/checkpoints."""
    checkpoints = root / "models" / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / CHECKPOINT).write_bytes(b"fake weights")
    return root


STUB_MAIN = f"""
import os, runpy, sys
sys.path.insert(0, {str(REPO_ROOT)!r})
if "--base-directory" not in sys.argv:
    sys.argv += ["--base-directory", os.path.dirname(os.path.abspath(__file__))]
runpy.run_module("tests.fixtures.fake_comfyui", run_name="__main__")
"""


def stub_comfyui(root: Path) -> Path:
    """A COMFYUI_PATH whose main.py starts the fake ComfyUI with ComfyUI's own flags."""
    comfy_base(root)
    (root / "main.py").write_text(STUB_MAIN)
    return root


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails if `data` is not a PNG."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def txt2img(prompt: str, prefix: str, **values: Any) -> dict[str, Any]:
    """The default text-to-image graph on the test checkpoint, 64x64, 3 steps."""
    base: dict[str, Any] = {
        "prompt": prompt,
        "checkpoint": CHECKPOINT,
        "filename_prefix": prefix,
        "width": 64,
        "height": 64,
        "steps": 3,
    }
    return TXT2IMG.render({**base, **values})


def model_free(prefix: str, **values: Any) -> dict[str, Any]:
    return MODEL_FREE_TEST.render({"filename_prefix": prefix, **values})


async def fake_state(http: httpx.AsyncClient) -> dict[str, Any]:
    state: dict[str, Any] = (await http.get("/_fake/comfy")).json()
    return state
