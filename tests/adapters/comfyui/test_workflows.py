"""Workflow templates: typed placeholders, bounds, and the rules every template keeps."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from adapters.comfyui import load_template
from adapters.comfyui.errors import InvalidWorkflowParameter
from adapters.comfyui.workflows import (
    MODEL_FREE_TEST,
    TXT2IMG,
    Param,
    WorkflowTemplate,
)
from runner.errors import ConfigError

VALUES = {"prompt": "a cat", "checkpoint": "sd15.safetensors", "filename_prefix": "quorum/j1"}


def test_render_fills_typed_values_and_defaults() -> None:
    """Whole-value placeholders keep their type; undeclared values come from the defaults."""
    graph = TXT2IMG.render({**VALUES, "width": 768, "seed": 42})
    assert graph["5"]["inputs"] == {"width": 768, "height": 512, "batch_size": 1}
    assert graph["3"]["inputs"]["seed"] == 42
    assert graph["3"]["inputs"]["cfg"] == 8.0
    assert graph["3"]["inputs"]["model"] == ["4", 0]
    assert graph["6"]["inputs"]["text"] == "a cat"
    assert graph["9"]["inputs"]["filename_prefix"] == "quorum/j1"


def test_render_leaves_the_template_untouched() -> None:
    """Rendering works on a copy: the template still holds its placeholders."""
    TXT2IMG.render(VALUES)
    assert TXT2IMG.graph["6"]["inputs"]["text"] == "{{prompt}}"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"width": 4096}, "width must be at most 2048"),
        ({"width": 500}, "width must be a multiple of 8"),
        ({"width": "512"}, "width must be an integer"),
        ({"batch_size": True}, "batch_size must be an integer"),
        ({"cfg": "high"}, "cfg must be a number"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"prompt": 7}, "prompt must be a string"),
        ({"sampler": "euler"}, "has no parameter(s) sampler"),
    ],
)
def test_render_refuses_a_bad_value_naming_it(values: dict[str, object], named: str) -> None:
    """A mistyped, out-of-bounds or unknown value is a 400 that names the parameter."""
    with pytest.raises(InvalidWorkflowParameter) as err:
        TXT2IMG.render({**VALUES, **values})
    assert named in str(err.value)
    assert err.value.status == 400


def test_render_requires_parameters_without_default() -> None:
    """A parameter with no default must be given."""
    with pytest.raises(InvalidWorkflowParameter, match="checkpoint is required"):
        TXT2IMG.render({"prompt": "x", "filename_prefix": "p"})


def test_template_without_filename_prefix_is_refused() -> None:
    """Every template saves under the per-job prefix (ComfyUI's cache would reuse files)."""
    graph = {"1": {"class_type": "SaveImage", "inputs": {"filename_prefix": "fixed"}}}
    with pytest.raises(ConfigError, match="filename_prefix"):
        WorkflowTemplate("t", graph, {})


def test_template_with_undeclared_placeholder_is_refused() -> None:
    """A placeholder without a declaration is a configuration error at load time."""
    graph = {
        "1": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "{{filename_prefix}}", "x": "{{mystery}}"},
        }
    }
    with pytest.raises(ConfigError, match="mystery"):
        WorkflowTemplate("t", graph, {"filename_prefix": Param("str")})


def test_placeholder_inside_text_is_replaced_by_its_text() -> None:
    """A placeholder inside a longer string is replaced by the value's text."""
    graph = {
        "1": {
            "class_type": "SaveImage",
            "inputs": {"filename_prefix": "out/{{filename_prefix}}_{{n}}"},
        }
    }
    template = WorkflowTemplate("t", graph, {"filename_prefix": Param("str"), "n": Param("int")})
    assert template.render({"filename_prefix": "j", "n": 3})["1"]["inputs"] == {
        "filename_prefix": "out/j_3"
    }


def test_load_template_reads_a_json_file(tmp_path: Path) -> None:
    """A template file declares typed parameters beside its API-format graph."""
    doc = {
        "name": "mine",
        "params": {
            "filename_prefix": {"type": "str"},
            "width": {"type": "int", "default": 64, "min": 8, "max": 128},
        },
        "graph": {
            "1": {"class_type": "EmptyImage", "inputs": {"width": "{{width}}"}},
            "2": {"class_type": "SaveImage", "inputs": {"filename_prefix": "{{filename_prefix}}"}},
        },
    }
    path = tmp_path / "mine.json"
    path.write_bytes(orjson.dumps(doc))
    template = load_template(str(path))
    assert template.name == "mine"
    assert template.render({"filename_prefix": "p"})["1"]["inputs"]["width"] == 64
    with pytest.raises(InvalidWorkflowParameter, match="at most 128"):
        template.render({"filename_prefix": "p", "width": 256})


def test_load_template_refuses_a_default_outside_its_bounds(tmp_path: Path) -> None:
    """A template whose default breaks its own bounds never loads."""
    inputs = {"filename_prefix": "{{filename_prefix}}", "w": "{{w}}"}
    doc = {
        "params": {
            "filename_prefix": {"type": "str"},
            "w": {"type": "int", "default": 1, "min": 8},
        },
        "graph": {"1": {"class_type": "SaveImage", "inputs": inputs}},
    }
    path = tmp_path / "bad.json"
    path.write_bytes(orjson.dumps(doc))
    with pytest.raises(ConfigError, match="default does not fit"):
        load_template(str(path))


def test_load_template_knows_the_builtins() -> None:
    """The built-in names resolve without a file."""
    assert load_template("txt2img") is TXT2IMG
    assert load_template("model-free-test") is MODEL_FREE_TEST
    assert MODEL_FREE_TEST.node_count == 3
