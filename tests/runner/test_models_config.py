"""The models file (runner/models_config.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import ConfigError
from runner.models_config import load_models_file


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return str(path)


def test_models_file_minimal_url_entry(tmp_path: Path) -> None:
    """The documented minimal form attaches an OpenAI-compatible engine by url."""
    f = load_models_file(
        _write(
            tmp_path, "models:\n  - id: echo\n    backend: openai\n    url: http://127.0.0.1:9000\n"
        )
    )
    assert [(m.id, m.url, m.slots) for m in f.models] == [("echo", "http://127.0.0.1:9000", 8)]


def test_models_file_accepts_later_fields(tmp_path: Path) -> None:
    """Fields of later backends are accepted on a url entry; parallel sets its slots."""
    f = load_models_file(
        _write(
            tmp_path,
            """
models:
  - id: a
    backend: openai
    url: http://h:1/base
    parallel: 3
    vram_mb: 100
    context_length: 4096
    pin: true
    keep_alive_s: 60
    priority: 2
    load_timeout_s: 30
    args: ["--x"]
""",
        )
    )
    assert f.models[0].slots == 3 and f.models[0].pin


def test_models_file_absent_means_no_models() -> None:
    """No MODELS_CONFIG: the runner starts with no models."""
    assert load_models_file(None).models == []


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("models:\n  - id: a\n    backend: openai\n", "url"),
        ("models:\n  - id: a\n    backend: tgi\n    url: http://h:1\n", "backend"),
        ("models:\n  - id: a\n    backend: openai\n    url: ftp://h\n", "url"),
        (
            "models:\n  - id: a\n    backend: openai\n    url: http://h:1\n    parallel: 0\n",
            "parallel",
        ),
        (
            "models:\n  - id: a\n    backend: openai\n    url: http://h:1\n    colour: red\n",
            "colour",
        ),
        (
            "models:\n  - {id: a, backend: openai, url: 'http://h:1'}\n"
            "  - {id: a, backend: openai, url: 'http://h:2'}\n",
            "twice",
        ),
        ("models: [\n", "YAML"),
        ("models:\n  - id: a\n    backend: vllm\n    checkpoint: m.safetensors\n", "comfyui"),
    ],
)
def test_models_file_invalid_is_refused_naming_problem(
    tmp_path: Path, text: str, fragment: str
) -> None:
    """An invalid models file raises ConfigError naming MODELS_CONFIG and the problem."""
    with pytest.raises(ConfigError) as info:
        load_models_file(_write(tmp_path, text))
    assert "MODELS_CONFIG" in str(info.value) and fragment in str(info.value)


def test_models_file_missing_is_refused(tmp_path: Path) -> None:
    """A path that does not exist is a start-up error, not an empty runner."""
    with pytest.raises(ConfigError):
        load_models_file(str(tmp_path / "nope.yaml"))
