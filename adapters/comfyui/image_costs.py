"""What an image request weighs on a ComfyUI model (pure): its scheduling cost and its work,
from the request and the model's workflow template (`ComfyShape`, adapters/comfyui/facet.py).
"""

from __future__ import annotations

import math

from adapters.comfyui.workflows import WorkflowTemplate
from adapters.image_request import ImageRequest


def image_work(template: WorkflowTemplate, request: ImageRequest) -> float:
    """The request's work in megapixel-steps (pure): images x width x height x sampler
    steps / 10^6, each from the request or the template's default (512 px; 1 step for a
    template without `steps`, such as the model-free one). ComfyUI's time for a prompt is
    close to a line in it (`runner/scheduler/work_fit.py` fits that line per model)."""
    width, height, steps, _ = _shape(template, request)
    return request.n * width * height * steps / 1e6


def image_cost(template: WorkflowTemplate, request: ImageRequest) -> int:
    """The request's scheduling cost in token-equivalents (pure; the fair share charges
    it): one per 32x32 pixel patch of every image at the size it runs at (asked, else the
    template's default), times the steps asked over the template's default steps when
    the template declares `steps` (a request at the defaults costs its patches)."""
    width, height, steps, default_steps = _shape(template, request)
    return max(1, math.ceil(request.n * width * height / 1024 * steps / default_steps))


def _shape(template: WorkflowTemplate, request: ImageRequest) -> tuple[float, float, float, float]:
    """(width, height, steps, the template's default steps) a request runs at: each from
    the request or the template's default (512 px; 1 step without a `steps` parameter)."""
    params = template.params

    def default(name: str, fallback: float) -> float:
        param = params.get(name)
        value = param.default if param is not None else None
        return float(value) if isinstance(value, int | float) and value > 0 else fallback

    width, height = request.size or (default("width", 512), default("height", 512))
    default_steps = default("steps", 1) if "steps" in params else 1.0
    steps = request.extras.get("steps")
    if not isinstance(steps, int | float) or "steps" not in params:
        steps = default_steps
    return float(width), float(height), float(steps), default_steps
