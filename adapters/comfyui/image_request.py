"""An image request's fields, as OpenAI's `POST /v1/images/generations` names them, checked
(pure; `adapters/comfyui/images.py` says what each field does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from adapters.comfyui.errors import InvalidImageRequest
from adapters.comfyui.node_limits import MAX_SEED
from adapters.comfyui.workflows import Value, WorkflowTemplate

ResponseFormat = Literal["b64_json", "url"]
MAX_N = 10
_SIZE = re.compile(r"([1-9][0-9]{0,4})x([1-9][0-9]{0,4})")
IGNORED_IMAGE_FIELDS = frozenset(
    {"quality", "style", "user", "background", "moderation", "output_compression"}
)
_EXTENSIONS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "x_negative_prompt": ("negative_prompt", str),
    "x_steps": ("steps", int),
    "x_cfg": ("cfg", (int, float)),
}
_KNOWN = frozenset(
    {"model", "prompt", "n", "size", "response_format", "output_format", "x_seed", "webhook"}
    | IGNORED_IMAGE_FIELDS
    | set(_EXTENSIONS)
)


@dataclass(frozen=True, slots=True)
class ImageRequest:
    model: str
    prompt: str
    n: int = 1
    size: tuple[int, int] | None = None
    response_format: ResponseFormat = "b64_json"
    seed: int | None = None
    extras: Mapping[str, Value] = field(default_factory=dict)
    webhook: str | None = None

    @property
    def cost(self) -> int:
        """Scheduling cost in token-equivalents without a template (`image_cost`): one per
        32x32 pixel patch of every image, 512x512 when no size is asked."""
        width, height = self.size or (512, 512)
        return max(1, self.n * (width * height) // 1024)


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


def parse_image_request(obj: Mapping[str, Any]) -> ImageRequest:
    """The request's fields, checked (pure).

    1. Unknown fields: 400 naming them.
    2. `model` and `prompt`: non-empty strings.
    3. `n`: an integer 1-10 (default 1).
    4. `size`: `"WxH"` or `"auto"` / absent (the template's defaults).
    5. `response_format`: `b64_json` (default) or `url`; `output_format`: `png` only.
    6. Extensions: `x_seed` an integer 0..2^64-1; `x_negative_prompt` text; `x_steps` an
       integer; `x_cfg` a number; `webhook` a string (checked by the job manager).
    """
    unknown = sorted(set(obj) - _KNOWN)  # 1
    if unknown:
        raise InvalidImageRequest(f"unrecognized request argument(s): {', '.join(unknown)}")
    model, prompt = obj.get("model"), obj.get("prompt")  # 2
    if not isinstance(model, str) or not model:
        raise InvalidImageRequest("the 'model' field is required and must be a string")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidImageRequest("the 'prompt' field is required and must be non-empty text")
    n = obj.get("n", 1)  # 3
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise InvalidImageRequest(f"n must be an integer from 1 to {MAX_N}")
    size = _parse_size(obj.get("size"))  # 4
    fmt: ResponseFormat
    match obj.get("response_format"):  # 5
        case None | "b64_json":
            fmt = "b64_json"
        case "url":
            fmt = "url"
        case _:
            raise InvalidImageRequest("response_format must be 'b64_json' or 'url'")
    if obj.get("output_format") not in (None, "png"):
        raise InvalidImageRequest("output_format must be 'png' (ComfyUI's SaveImage writes PNG)")
    seed = obj.get("x_seed")  # 6
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
    ):
        raise InvalidImageRequest("x_seed must be an integer from 0 to 2^64-1")
    extras: dict[str, Value] = {}
    for key, (param, kinds) in _EXTENSIONS.items():
        value = obj.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise InvalidImageRequest(f"{key} has the wrong type")
        assert isinstance(value, str | int | float)
        extras[param] = value
    webhook = obj.get("webhook")
    if webhook is not None and not isinstance(webhook, str):
        raise InvalidImageRequest("webhook must be a URL string")
    return ImageRequest(model, prompt, n, size, fmt, seed, extras, webhook)


def _parse_size(size: object) -> tuple[int, int] | None:
    if size is None or size == "auto":
        return None
    match = _SIZE.fullmatch(size) if isinstance(size, str) else None
    if match is None:
        raise InvalidImageRequest("size must be 'WIDTHxHEIGHT' (e.g. '1024x1024') or 'auto'")
    return int(match.group(1)), int(match.group(2))
