"""The fake ComfyUI the image handler's tests run against (the adapter tests' fixtures)."""

from tests.adapters.comfyui.conftest import client, comfy, comfy_dir, http

__all__ = ["client", "comfy", "comfy_dir", "http"]
