"""An image request's fields, as OpenAI's `POST /v1/images/generations` names them, checked
(pure): the data every image kind is handed (adapters/images.py); what each field does is
the kind's (ComfyUI's: `adapters/comfyui/images.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from adapters.errors import InvalidImageRequest

ResponseFormat = Literal["b64_json", "url"]
Value = str | int | float
"""An extension field's value (`x_steps`, `x_cfg`, `x_negative_prompt`)."""
MAX_N = 10
MAX_SEED = 0xFFFF_FFFF_FFFF_FFFF
"""`x_seed`'s bound: an unsigned 64-bit seed (ComfyUI's KSampler takes the same)."""
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
        """Scheduling cost in token-equivalents without a model's shape: one per
        32x32 pixel patch of every image, 512x512 when no size is asked."""
        width, height = self.size or (512, 512)
        return max(1, self.n * (width * height) // 1024)


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
