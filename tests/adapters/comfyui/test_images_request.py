"""The OpenAI images request: its fields checked, and mapped to a template's parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from adapters.comfyui.client import ComfyUIClient
from adapters.comfyui.images import workflow_values
from adapters.comfyui.workflows import MODEL_FREE_TEST, TXT2IMG, WorkflowTemplate
from adapters.errors import InvalidImageRequest
from adapters.image_request import ImageRequest, parse_image_request


@dataclass
class _Model:
    template: WorkflowTemplate
    checkpoint: str | None = "sd15.safetensors"
    model_id: str = "sd"
    client: ComfyUIClient = None  # type: ignore[assignment]

    def ensure_ready(self) -> None:
        return None


def test_parse_defaults() -> None:
    """Only prompt and model given: one image, template size, b64_json."""
    request = parse_image_request({"model": "sd", "prompt": "a cat"})
    assert request == ImageRequest("sd", "a cat")
    assert request.response_format == "b64_json" and request.size is None and request.n == 1


def test_parse_reads_every_supported_field() -> None:
    """size, n, response_format, the x_ extensions and webhook are read; ignored fields pass."""
    request = parse_image_request(
        {
            "model": "sd",
            "prompt": "a cat",
            "n": 3,
            "size": "768x512",
            "response_format": "url",
            "quality": "hd",
            "style": "vivid",
            "user": "u1",
            "output_format": "png",
            "x_seed": 7,
            "x_negative_prompt": "blurry",
            "x_steps": 4,
            "x_cfg": 6.5,
            "webhook": "https://example.test/hook",
        }
    )
    assert (request.n, request.size, request.response_format, request.seed) == (
        3,
        (768, 512),
        "url",
        7,
    )
    assert request.extras == {"negative_prompt": "blurry", "steps": 4, "cfg": 6.5}
    assert request.webhook == "https://example.test/hook"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": "x"}, "'model' field is required"),
        ({"model": "sd"}, "'prompt' field is required"),
        ({"model": "sd", "prompt": "  "}, "'prompt' field is required"),
        ({"model": "sd", "prompt": "x", "n": 0}, "n must be an integer from 1 to 10"),
        ({"model": "sd", "prompt": "x", "n": 11}, "n must be an integer from 1 to 10"),
        ({"model": "sd", "prompt": "x", "n": True}, "n must be an integer"),
        ({"model": "sd", "prompt": "x", "size": "1024"}, "size must be 'WIDTHxHEIGHT'"),
        ({"model": "sd", "prompt": "x", "size": "0x64"}, "size must be 'WIDTHxHEIGHT'"),
        ({"model": "sd", "prompt": "x", "response_format": "png"}, "response_format must be"),
        ({"model": "sd", "prompt": "x", "output_format": "webp"}, "output_format must be 'png'"),
        ({"model": "sd", "prompt": "x", "x_seed": -1}, "x_seed must be an integer"),
        ({"model": "sd", "prompt": "x", "x_steps": "4"}, "x_steps has the wrong type"),
        ({"model": "sd", "prompt": "x", "seed": 1}, "unrecognized request argument(s): seed"),
    ],
)
def test_parse_refuses_bad_fields(body: dict[str, Any], says: str) -> None:
    """A bad or unknown field is a 400 `invalid_image_request` naming it."""
    with pytest.raises(InvalidImageRequest) as err:
        parse_image_request(body)
    assert says in str(err.value)
    assert err.value.code == "invalid_image_request"


def test_workflow_values_for_txt2img() -> None:
    """prompt, n, size, seed, checkpoint, prefix and extensions become template parameters."""
    request = parse_image_request(
        {"model": "sd", "prompt": "a cat", "n": 2, "size": "256x128", "x_steps": 5}
    )
    values = workflow_values(_Model(TXT2IMG), request, 99, "quorum/j")
    assert values == {
        "filename_prefix": "quorum/j",
        "checkpoint": "sd15.safetensors",
        "seed": 99,
        "prompt": "a cat",
        "batch_size": 2,
        "width": 256,
        "height": 128,
        "steps": 5,
    }
    TXT2IMG.render(values)  # renders as it is


def test_workflow_values_skip_what_the_template_does_not_take() -> None:
    """The model-free template has no prompt, seed or checkpoint: they are left out."""
    request = parse_image_request({"model": "t", "prompt": "ignored", "size": "32x16"})
    values = workflow_values(_Model(MODEL_FREE_TEST), request, 1, "quorum/j")
    assert values == {"filename_prefix": "quorum/j", "batch_size": 1, "width": 32, "height": 16}


def test_workflow_values_refuse_an_extension_the_template_lacks() -> None:
    """x_steps for a template without steps is a 400, not silently dropped."""
    request = parse_image_request({"model": "t", "prompt": "x", "x_steps": 3})
    with pytest.raises(InvalidImageRequest, match="does not take x_steps"):
        workflow_values(_Model(MODEL_FREE_TEST), request, 1, "p")


def test_cost_grows_with_pixels_and_images() -> None:
    """The scheduling cost is one unit per 32x32 patch of every image."""
    assert ImageRequest("m", "p", n=2, size=(1024, 1024)).cost == 2048
    assert ImageRequest("m", "p").cost == 256
