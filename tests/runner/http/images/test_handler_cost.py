"""An image request is weighed by what it makes (issue 36, item 7): n x the size it runs
at (the template's default when it asks none) x the steps it asks over the template's
default; the synchronous request's ticket and its job's alike (`runner/http/images/handler.py`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from adapters.comfyui.facet import ComfyShape
from adapters.comfyui.images import ImageGenerator
from adapters.comfyui.workflows import MODEL_FREE_TEST, TXT2IMG, WorkflowTemplate
from adapters.image_request import parse_image_request
from runner.http.images.handler import _ticket

pytestmark = pytest.mark.timeout(30)


def _sdxl() -> WorkflowTemplate:
    """TXT2IMG with SDXL's 1024x1024 default size (20 steps)."""
    params = dict(TXT2IMG.params)
    for side in ("width", "height"):
        params[side] = dataclasses.replace(params[side], default=1024)
    return dataclasses.replace(TXT2IMG, params=params)


def _cost(template: WorkflowTemplate, **fields: Any) -> int:
    request = parse_image_request({"model": "sd", "prompt": "a cat", **fields})
    call: Any = SimpleNamespace(tenant="t", meta=SimpleNamespace(priority="normal"))
    shape = ComfyShape("sd", template, None, ImageGenerator())
    return _ticket("r", call, request, shape).est_output_tokens


def test_images_cost_counts_the_templates_default_size() -> None:
    """No `size` asked of a 1024x1024 template: 1,024 patches per image, not 512x512's 256."""
    assert _cost(_sdxl()) == 1024
    assert _cost(_sdxl(), n=3) == 3 * 1024
    assert _cost(TXT2IMG) == 256


def test_images_cost_counts_the_steps_asked() -> None:
    """`x_steps` 40 on a 20-step template weighs twice its default; fewer steps, less."""
    assert _cost(TXT2IMG, size="512x512", x_steps=40) == 2 * 256
    assert _cost(TXT2IMG, size="512x512", x_steps=5) == 64
    assert _cost(TXT2IMG, n=2, size="1024x512", x_steps=20) == 2 * 512


def test_images_cost_without_steps_is_size_only() -> None:
    """A template that declares no steps (the model-free one): n x size only."""
    assert MODEL_FREE_TEST.params.get("steps") is None
    assert _cost(MODEL_FREE_TEST, n=2, size="64x64") == 8
