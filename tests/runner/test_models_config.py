"""The models file (runner/runtime/models_file.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engines.kinds import EngineKinds
from runner.errors import ConfigError
from runner.runtime.models_file import ModelSpec, default_models_path, load_models_file
from tests.support.runner_proc import REPO_ROOT

KINDS = EngineKinds()
slots = KINDS.slots  # `parallel`, else the kind's default


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return str(path)


def test_models_file_minimal_url_entry(tmp_path: Path) -> None:
    """The documented minimal form attaches an OpenAI-compatible engine by url."""
    f = load_models_file(
        _write(
            tmp_path, "models:\n  - id: echo\n    backend: openai\n    url: http://127.0.0.1:9000\n"
        ),
        KINDS,
    )
    assert [(m.id, m.url, slots(m)) for m in f.models] == [("echo", "http://127.0.0.1:9000", 8)]


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
        ),
        KINDS,
    )
    assert slots(f.models[0]) == 3 and f.models[0].pin


def test_models_file_absent_means_no_models() -> None:
    """No MODELS_CONFIG: the runner starts with no models."""
    assert load_models_file(None, KINDS).models == []


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
        load_models_file(_write(tmp_path, text), KINDS)
    assert "MODELS_CONFIG" in str(info.value) and fragment in str(info.value)


def test_models_file_missing_is_refused(tmp_path: Path) -> None:
    """A path that does not exist is a start-up error, not an empty runner."""
    with pytest.raises(ConfigError):
        load_models_file(str(tmp_path / "nope.yaml"), KINDS)


def test_models_file_faster_whisper_by_path_package_or_size(tmp_path: Path) -> None:
    """A speech model names a CTranslate2 directory, a directory inside an installed Python
    package (`package:<module>/<dir>`), or a faster-whisper size name."""
    f = load_models_file(
        _write(
            tmp_path,
            f"""
models:
  - {{id: dir, backend: faster-whisper, path: {tmp_path}, parallel: 2}}
  - {{id: pkg, backend: faster-whisper, path: "package:runner/engines"}}
  - {{id: size, backend: faster-whisper, whisper_model: tiny.en}}
""",
        ),
        KINDS,
    )
    by_id = {m.id: m for m in f.models}
    assert by_id["dir"].local_path() == tmp_path and slots(by_id["dir"]) == 2
    pkg = by_id["pkg"].local_path()
    assert pkg is not None and pkg.is_dir() and pkg.name == "engines"
    assert by_id["size"].local_path() is None and slots(by_id["size"]) == 1


def test_models_file_package_path_of_a_missing_package_is_none() -> None:
    """`package:` naming a package that is not installed resolves to no path (the load
    fails naming it; the runner still starts)."""
    spec = ModelSpec(id="w", backend="faster-whisper", path="package:no_such_pkg_q/model")
    assert spec.local_path() is None


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ("{id: a, backend: faster-whisper}", "one of path, hf, whisper_model"),
        ("{id: a, backend: faster-whisper, path: /m, whisper_model: tiny}", "one of path"),
        ("{id: a, backend: faster-whisper, whisper_model: huge}", "whisper_model must be"),
        ("{id: a, backend: faster-whisper, url: 'http://h:1'}", "no url"),
        ("{id: a, backend: llama-server, path: /m.gguf, whisper_model: tiny}", "faster-whisper"),
        ("{id: a, backend: faster-whisper, path: 'package:../x'}", "package:<module>"),
    ],
)
def test_models_file_bad_faster_whisper_entry_is_refused(
    tmp_path: Path, entry: str, fragment: str
) -> None:
    """A speech model with no model, two of them, an unknown size, a url, or a bad package
    path is refused naming the problem."""
    with pytest.raises(ConfigError) as info:
        load_models_file(_write(tmp_path, f"models:\n  - {entry}\n"), KINDS)
    assert fragment in str(info.value)


def test_default_models_path_is_the_repositorys_models_yaml() -> None:
    """With MODELS_CONFIG unset the runner reads the repository's models.yaml (scripts/run
    served no model at all when this pointed inside runner/), and it loads."""
    path = default_models_path()
    assert path == str(REPO_ROOT / "models.yaml")
    ids = [spec.id for spec in load_models_file(path, KINDS).models]
    assert ids[0] == "smollm2-135m-instruct" and "gemma-3-270m" in ids
