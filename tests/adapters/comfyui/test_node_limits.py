"""Templates held to ComfyUI's own input limits when they are loaded (issue 29): bounds
beyond ComfyUI's are refused, missing ones become ComfyUI's, so a request the template
lets through is one ComfyUI's `POST /prompt` accepts (never a 202, then a refusal)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.comfyui import MODEL_FREE_TEST, TXT2IMG, load_template
from adapters.comfyui.errors import InvalidWorkflowParameter
from adapters.comfyui.node_limits import MAX_RESOLUTION, NODE_LIMITS, choices_of, limit_of
from faults import ConfigError
from tests.fixtures._comfy_nodes import NODES
from tests.fixtures._comfy_validation import validate_prompt


def _file(tmp_path: Path, params: dict[str, Any], inputs: dict[str, Any]) -> str:
    """A template file: EmptyImage (with `inputs`) -> SaveImage."""
    doc = {
        "name": "wide",
        "params": {"filename_prefix": {"type": "str"}, **params},
        "graph": {
            "1": {"class_type": "EmptyImage", "inputs": {"batch_size": 1, "color": 0, **inputs}},
            "2": {
                "class_type": "SaveImage",
                "inputs": {"filename_prefix": "{{filename_prefix}}", "images": ["1", 0]},
            },
        },
    }
    path = tmp_path / "wide.json"
    path.write_bytes(orjson.dumps(doc))
    return str(path)


def test_template_declaring_a_bound_beyond_comfyuis_is_refused_at_load(tmp_path: Path) -> None:
    """A width of up to 100000 on EmptyImage (ComfyUI: 16384) never loads; the error names
    the parameter, the node input and ComfyUI's limit."""
    width = {"type": "int", "default": 64, "min": 1, "max": 100000}
    path = _file(tmp_path, {"width": width}, {"width": "{{width}}", "height": 64})
    with pytest.raises(ConfigError) as caught:
        load_template(path)
    message = str(caught.value)
    assert "'width' allows up to 100000" in message
    assert "EmptyImage.width (node 1) must be at most 16384" in message


def test_template_without_bounds_gets_comfyuis(tmp_path: Path) -> None:
    """No declared max: ComfyUI's becomes the template's, so 20000 is the runner's 400
    naming the parameter, as the synchronous and the async request both get it."""
    width = {"type": "int", "default": 64}
    path = _file(tmp_path, {"width": width}, {"width": "{{width}}", "height": 64})
    template = load_template(path)
    assert template.params["width"].maximum == MAX_RESOLUTION
    assert template.params["width"].minimum == 1
    with pytest.raises(InvalidWorkflowParameter, match="width must be at most 16384"):
        template.render({"filename_prefix": "p", "width": 20000})


def test_template_fixed_value_outside_comfyuis_limit_is_refused(tmp_path: Path) -> None:
    """A literal the graph fixes beyond ComfyUI's limit would fail every request: refused."""
    path = _file(tmp_path, {}, {"width": 20000, "height": 64})
    with pytest.raises(ConfigError, match=r"EmptyImage.width \(node 1\) is 20000"):
        load_template(path)


@pytest.mark.parametrize(
    ("params", "inputs", "match"),
    [
        ({"width": {"type": "str", "default": "64"}}, {"width": "{{width}}"}, "is text"),
        ({"width": {"type": "int", "default": 64}}, {"width": "{{width}}0"}, "whole value"),
        ({"width": {"type": "int", "default": 0}}, {"width": "{{width}}"}, "default of width"),
    ],
    ids=["text-param", "placeholder-in-text", "default-below-comfyuis-min"],
)
def test_template_feeding_a_number_input_badly_is_refused(
    tmp_path: Path, params: dict[str, Any], inputs: dict[str, Any], match: str
) -> None:
    """A number input fed text, a placeholder inside text, or a default ComfyUI refuses:
    refused when the template loads."""
    with pytest.raises(ConfigError, match=match):
        load_template(_file(tmp_path, params, {"height": 64, **inputs}))


def test_builtins_are_within_comfyuis_limits() -> None:
    """The built-in templates load unchanged: their bounds are inside ComfyUI's."""
    assert load_template("txt2img") is TXT2IMG
    assert load_template("model-free-test") is MODEL_FREE_TEST


def test_the_fakes_nodes_declare_the_pinned_limits() -> None:
    """Every number limit the fake ComfyUI validates is the pinned one (the pinned table
    was compared with the real ComfyUI 0.3.64's `GET /object_info`: docs/engines.md)."""
    checked = 0
    for name, node in NODES.items():
        for input_name, (kind, options) in node.required.items():
            if kind in ("INT", "FLOAT") and ("min" in options or "max" in options):
                limit = limit_of(name, input_name)
                assert limit is not None, f"{name}.{input_name}"
                assert (limit.kind, limit.minimum, limit.maximum) == (
                    kind,
                    options["min"],
                    options["max"],
                ), f"{name}.{input_name}"
                checked += 1
    assert checked >= 10 and "EmptyLatentImage" in NODE_LIMITS


def _scale_graph(method: object, prefix: str = "{{filename_prefix}}") -> dict[str, Any]:
    """EmptyImage -> ImageScale (`upscale_method`) -> SaveImage."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0},
        },
        "2": {
            "class_type": "ImageScale",
            "inputs": {
                "image": ["1", 0],
                "upscale_method": method,
                "width": 16,
                "height": 16,
                "crop": "disabled",
            },
        },
        "3": {"class_type": "SaveImage", "inputs": {"filename_prefix": prefix, "images": ["2", 0]}},
    }


def _scale_file(tmp_path: Path, params: dict[str, Any], method: object) -> str:
    doc = {
        "name": "scale",
        "params": {"filename_prefix": {"type": "str"}, **params},
        "graph": _scale_graph(method),
    }
    path = tmp_path / "scale.json"
    path.write_bytes(orjson.dumps(doc))
    return str(path)


def test_template_fixed_choice_outside_comfyuis_list_is_refused(tmp_path: Path) -> None:
    """A literal choice ComfyUI does not list would fail every request: refused at load."""
    with pytest.raises(ConfigError, match=r"ImageScale.upscale_method \(node 2\) is 'bogus'"):
        load_template(_scale_file(tmp_path, {}, "bogus"))


def test_template_text_feeding_a_choice_takes_comfyuis_choices(tmp_path: Path) -> None:
    """A text parameter feeding a fixed choice takes ComfyUI's list: another text is the
    runner's 400 naming the parameter; a number parameter there never loads."""
    method = {"type": "str", "default": "area"}
    template = load_template(_scale_file(tmp_path, {"method": method}, "{{method}}"))
    assert template.params["method"].choices == choices_of("ImageScale", "upscale_method")
    template.render({"filename_prefix": "p", "method": "lanczos"})
    with pytest.raises(InvalidWorkflowParameter, match="method must be one of 'nearest-exact'"):
        template.render({"filename_prefix": "p", "method": "bogus"})
    number = {"type": "int", "default": 1}
    with pytest.raises(ConfigError, match=r"is a number but feeds ImageScale\.upscale_method"):
        load_template(_scale_file(tmp_path, {"method": number}, "{{method}}"))


@dataclass
class _Catalog:
    checkpoints: list[str]


def test_the_fakes_choices_are_the_pinned_ones() -> None:
    """Every fixed-choice input of the fake's nodes lists what the pinned table lists, and
    the fake refuses a text outside it as ComfyUI does (`value_not_in_list`)."""
    checked = 0
    for name, node in NODES.items():
        for input_name, (kind, _) in node.required.items():
            if isinstance(kind, list) and name != "CheckpointLoaderSimple":
                assert tuple(kind) == choices_of(name, input_name), f"{name}.{input_name}"
                checked += 1
    assert checked >= 4
    ok, error, _, node_errors = validate_prompt(_scale_graph("bogus", "p"), _Catalog([]))
    assert not ok and error is not None
    assert node_errors["2"]["errors"][0]["type"] == "value_not_in_list"
    assert validate_prompt(_scale_graph("bicubic", "p"), _Catalog([]))[0]
