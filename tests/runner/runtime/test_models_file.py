"""The models file (runner/floor/models_file.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engines.kinds import EngineKinds
from runner.errors import ConfigError
from runner.floor.models_file import ModelSpec, default_models_path, load_models_file
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


def test_models_file_adapters_and_public_prefixes(tmp_path: Path) -> None:
    """A llama-server or vLLM model carries adapters, each served as `<base>:<name>` (or the
    id it declares) to the tenants it lists, and a llama-server public prefixes."""
    f = load_models_file(
        _write(
            tmp_path,
            f"""
models:
  - id: base
    backend: llama-server
    path: {tmp_path}/m.gguf
    adapters:
      - {{name: alpha, path: /a/alpha.gguf, tenants: [team-a, "ops-*"]}}
      - {{name: bravo, id: acme-support, path: /a/b.gguf, tenants: ["*"], scale: 0.5}}
    public_prefixes:
      - {{name: ops, system: "{"You are the platform's shared assistant. " * 3}"}}
""",
        ),
        KINDS,
    )
    (spec,) = f.models
    assert [a.model_id("base") for a in spec.adapters] == ["base:alpha", "acme-support"]
    assert spec.adapter_capacity == 2 and spec.public_prefixes[0].name == "ops"


A = "adapters: [{name: a, path: /x, tenants: [t]}]"
LLAMA = "id: m, backend: llama-server, path: /m"
TWICE = "{name: a, path: /x, tenants: [t]}"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (f"{{id: m, backend: comfyui, workflow: txt2img, {A}}}", "'llama-server' or 'vllm' only"),
        (f"{{id: m, backend: vllm, url: 'http://h:1', {A}}}", "an engine the runner starts"),
        (f"{{{LLAMA}, adapters: [{{name: a, path: /x}}]}}", "tenants"),
        (f"{{{LLAMA}, adapters: [{TWICE}, {TWICE}]}}", "two adapters share a name"),
        (f"{{{LLAMA}, max_adapters: 0, {A}}}", "more adapters than max_adapters"),
        ("{id: m, backend: vllm, path: /m, public_prefixes: [{name: p, prompt: " + "x" * 80 + "}]}",
         "public_prefixes applies to backend 'llama-server' only"),
        ("{id: m, backend: llama-server, url: 'http://h:1', public_prefixes: [{name: p, prompt: "
         + "x" * 80 + "}]}", "public_prefixes apply to a llama-server the runner starts"),
        (f"{{{LLAMA}, public_prefixes: [{{name: p, system: short}}]}}", "at least 64"),
        (f"{{{LLAMA}, args: [--lora, /a.gguf]}}", "declare LoRA adapters under adapters"),
        ("{id: m, backend: vllm, path: /m, args: [--enable-lora]}", "under adapters"),
    ],
)  # fmt: skip
def test_models_file_adapter_mistakes_refused(tmp_path: Path, entry: str, problem: str) -> None:
    """Adapters and public prefixes where they cannot work, or incomplete, stop start-up
    with the problem named."""
    with pytest.raises(ConfigError, match=problem):
        load_models_file(_write(tmp_path, f"models:\n  - {entry}\n"), KINDS)


def test_models_file_adapter_id_clashing_with_a_model_refused(tmp_path: Path) -> None:
    """An adapter's model id must not be another model's."""
    text = """models:
  - {id: "m:a", backend: llama-server, path: /x}
  - {id: m, backend: llama-server, path: /m, adapters: [{name: a, path: /y, tenants: [t]}]}
"""
    with pytest.raises(ConfigError, match="appears twice"):
        load_models_file(_write(tmp_path, text), KINDS)


def test_models_file_pass_through_is_read_per_model(tmp_path: Path) -> None:
    """`pass_through` lists request fields one model lets through: its request fields are
    its kind's plus those, on every chat-path endpoint; another model's are its kind's."""
    from runner.engines.specs import ModelSpecs

    text = (
        "models:\n"
        "  - {id: a, backend: llama-server, url: 'http://h:1', pass_through: [speculative.n_max]}\n"
        "  - {id: b, backend: llama-server, url: 'http://h:2'}\n"
    )
    models = load_models_file(_write(tmp_path, text), KINDS).models
    assert models[0].pass_through == ["speculative.n_max"]
    specs = ModelSpecs(models, KINDS, lambda _gpus: None)
    a, b = specs.request_fields("a"), specs.request_fields("b")
    assert a is not None and b is not None
    assert "speculative.n_max" in a.passed("/v1/chat/completions")
    assert "speculative.n_max" in a.passed("/v1/completions")
    assert "speculative.n_max" not in b.passed("/v1/chat/completions")


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            "{id: m, backend: llama-server, url: 'http://h:1', pass_through: [n_predict]}",
            "pass_through 'n_predict' is the engine kind's own name of an output limit",
        ),
        (
            "{id: m, backend: llama-server, url: 'http://h:1', pass_through: [n_cmpl]}",
            "pass_through 'n_cmpl' is the engine kind's own name",
        ),
        (
            "{id: m, backend: llama-server, url: 'http://h:1', pass_through: [n_discard]}",
            "pass_through 'n_discard' changes how many tokens or completions",
        ),
        (
            "{id: m, backend: vllm, path: /m, pass_through: [use_beam_search]}",
            "pass_through 'use_beam_search' changes how many tokens",
        ),
        (
            "{id: m, backend: openai, url: 'http://h:1', pass_through: [max_new_tokens]}",
            "pass_through 'max_new_tokens' changes how many tokens",
        ),
        (
            "{id: m, backend: comfyui, workflow: txt2img, pass_through: [seed]}",
            "applies to the chat path's kinds",
        ),
        ("{id: m, backend: openai, url: 'http://h:1', pass_through: ['a b']}", "pass_through.0"),
    ],
)
def test_models_file_pass_through_refused_where_the_kind_cannot_count_it(
    tmp_path: Path, entry: str, problem: str
) -> None:
    """A pass-through field the kind reads as more work than the bound (or counts by its
    own rule already), on a kind off the chat path, or not a field name: start-up stops
    naming it."""
    with pytest.raises(ConfigError, match=problem):
        load_models_file(_write(tmp_path, f"models:\n  - {entry}\n"), KINDS)
