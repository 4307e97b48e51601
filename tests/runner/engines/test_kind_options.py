"""A kind's own models-file fields (`Traits.options`: comfyui's `workflow` and
`checkpoint`, faster-whisper's `whisper_model`): read from the models file as before,
refused on another kind, refused when misspelt or mistyped, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engines.kinds import EngineKinds
from runner.errors import ConfigError
from runner.floor.models_file import load_models_file

KINDS = EngineKinds()

COMFY = "  - id: sd\n    backend: comfyui\n    url: http://127.0.0.1:8188\n"
WHISPER = "  - id: w\n    backend: faster-whisper\n"


def _load(tmp_path: Path, entry: str) -> str:
    path = tmp_path / "models.yaml"
    path.write_text("models:\n" + entry)
    return str(path)


def test_kind_options_reach_the_kind_as_the_models_file_wrote_them(tmp_path: Path) -> None:
    """workflow, checkpoint and whisper_model are what the kinds are handed."""
    entry = COMFY + "    workflow: txt2img\n    checkpoint: v1.safetensors\n"
    sd = load_models_file(_load(tmp_path, entry), KINDS).models[0]
    shape = KINDS.of(sd).image_shape(KINDS.engine_spec(sd))
    assert shape is not None and shape.checkpoint == "v1.safetensors"
    w = load_models_file(_load(tmp_path, WHISPER + "    whisper_model: tiny.en\n"), KINDS)
    spec = KINDS.engine_spec(w.models[0])
    assert KINDS.of(w.models[0]).estimate_mb(spec, None) == round(75 * 1.5) + 256


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (COMFY + "    workfow: txt2img\n", "workfow: Extra inputs are not permitted"),
        (COMFY + "    workflow: 3\n", "workflow: Input should be a valid string"),
        (WHISPER + "    whisper_model: [tiny]\n", "whisper_model: Input should be a valid string"),
        (WHISPER + "    whisper_model: enormous\n", "whisper_model must be one of"),
        (COMFY.replace("comfyui", "openai") + "    workflow: txt2img\n", "applies to backend"),
    ],
)
def test_kind_options_refused_naming_the_field(tmp_path: Path, entry: str, says: str) -> None:
    """A misspelt, mistyped or misplaced field of a kind stops the start naming it."""
    with pytest.raises(ConfigError, match=says):
        load_models_file(_load(tmp_path, entry), KINDS)
