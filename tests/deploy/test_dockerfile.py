"""The Dockerfile, parsed (dockerfile-parse): no Docker engine runs here, so these tests pin
that its build steps are the scripts CI runs, that each step has what it reads, and that the
runtime stage runs `quorum serve` on the embedded default as a non-root user under tini."""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from runner.floor.settings import Settings
from tests.deploy.tools import ROOT


@dataclass(frozen=True)
class Step:
    instruction: str
    value: str


def _stages() -> dict[str, list[Step]]:
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    stages: dict[str, list[Step]] = {}
    current: list[Step] | None = None
    for item in parser.structure:
        step = Step(item["instruction"], item["value"])
        if step.instruction == "FROM":
            name = step.value.split()[-1]
            current = stages[name] = [step]
        elif current is not None:
            current.append(step)
    return stages


def _runs(steps: list[Step]) -> list[list[str]]:
    return [shlex.split(s.value) for s in steps if s.instruction == "RUN"]


def _env(steps: list[Step]) -> dict[str, str]:
    env: dict[str, str] = {}
    for step in steps:
        if step.instruction == "ENV":
            for pair in shlex.split(step.value):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def _script_calls(path: Path) -> set[str]:
    """The project scripts a shell script runs (`scripts/...` as a command word)."""
    calls = set()
    for line in path.read_text().replace("\\\n", " ").splitlines():  # continuations joined
        words = shlex.split(line, comments=True)
        for word in words[:2]:  # `scripts/x ...` or `exec scripts/x ...`
            if word.startswith("scripts/"):
                calls.add(word)
    return calls


@pytest.fixture(scope="module")
def stages() -> dict[str, list[Step]]:
    return _stages()


def test_dockerfile_builder_runs_the_scripts_ci_runs(stages: dict[str, list[Step]]) -> None:
    """The builder's only build commands are scripts/install-llama-server and scripts/install,
    the same scripts CI reaches from .ci/run."""
    assert list(stages) == ["builder", "runtime"]
    commands = [run[0] for run in _runs(stages["builder"])]
    assert commands == ["scripts/install-llama-server", "scripts/install"]
    assert _script_calls(ROOT / ".ci" / "run") == {"scripts/test"}
    assert "scripts/install" in _script_calls(ROOT / "scripts" / "test")
    assert "scripts/install-llama-server" in _script_calls(ROOT / "scripts" / "install")


def test_dockerfile_copies_what_each_script_reads(stages: dict[str, list[Step]]) -> None:
    """Before each script runs, the image has the script and what it installs from: the
    pyproject, its readme, the locks, models.yaml and every package setuptools finds."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    needed = {
        "scripts/install-llama-server": {"scripts/install-llama-server", "scripts/progress.py"},
        "scripts/install": {
            "scripts",
            "pyproject.toml",
            "requirements",
            pyproject["project"]["readme"],
            "models.yaml",
            *packages,
        },
    }
    copied: set[str] = set()
    for step in stages["builder"]:
        if step.instruction == "COPY":
            *sources, dest = shlex.split(step.value)
            for source in sources:
                assert (ROOT / source).exists(), source
                copied.add(source if dest != "./" else PurePosixPath(source).name)
        elif step.instruction == "RUN":
            script = shlex.split(step.value)[0]
            missing = {n for n in needed[script] if n not in copied}
            assert not missing, f"{script} runs before {sorted(missing)} is copied"


def test_dockerfile_build_context_keeps_local_state_out() -> None:
    """.dockerignore leaves the local virtualenv, git and node_modules out of the context."""
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "tests/deploy/node/node_modules"} <= ignored


def test_dockerfile_runtime_serves_the_embedded_default_as_non_root(
    stages: dict[str, list[Step]],
) -> None:
    """Runtime: tini as init, a numeric non-root user, one exposed port (the runner's),
    `quorum serve` with no models file set (the embedded models.yaml)."""
    runtime = stages["runtime"]
    by = {s.instruction: s for s in runtime}
    assert runtime[0].value == stages["builder"][0].value.replace("AS builder", "AS runtime")
    user = by["USER"].value.split(":")[0]
    assert user.isdigit() and int(user) != 0
    entrypoint = json.loads(by["ENTRYPOINT"].value)
    assert entrypoint == ["/usr/bin/tini", "--"]
    assert any("tini" in run for run in _runs(runtime) if "apt-get" in run)
    exposed = [s.value for s in runtime if s.instruction == "EXPOSE"]
    assert exposed == [str(Settings.model_fields["port"].default)]
    assert json.loads(by["CMD"].value) == ["quorum", "serve"]
    env = _env(runtime)
    assert "MODELS_CONFIG" not in env and "LLAMA_SERVER_BIN" not in env
    assert env["PATH"].startswith("/app/.venv/bin:")


def test_dockerfile_runtime_has_every_path_the_default_models_file_names(
    stages: dict[str, list[Step]],
) -> None:
    """models.yaml's `~/` paths and the default llama-server resolve under the runtime HOME
    to something copied from the builder, where scripts/install put them."""
    runtime, builder = stages["runtime"], stages["builder"]
    home = _env(runtime)["HOME"]
    assert home == _env(builder)["HOME"]
    copied = [
        shlex.split(s.value)[-1]
        for s in runtime
        if s.instruction == "COPY" and "--from=builder" in s.value
    ]
    models = yaml.safe_load((ROOT / "models.yaml").read_text())["models"]
    paths = [m["path"] for m in models if m["path"].startswith("~/")]
    paths.append("~/.cache/quorum/llama-server/")  # adapters/llama_server/kind.default_binary
    for path in paths:
        absolute = home + path[1:]
        assert any(absolute.startswith(dest.rstrip("/") + "/") for dest in copied), path


def test_dockerfile_gpu_variant_is_a_build_arg_of_a_real_extra(
    stages: dict[str, list[Step]],
) -> None:
    """`--build-arg QUORUM_EXTRAS=gpu` installs pyproject's `gpu` extra through the same
    scripts/install, which reads QUORUM_EXTRAS."""
    args = [s.value for s in stages["builder"] if s.instruction == "ARG"]
    assert 'QUORUM_EXTRAS=""' in args
    assert _env(stages["builder"])["QUORUM_EXTRAS"] == "${QUORUM_EXTRAS}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(dep.startswith("vllm==") for dep in extras["gpu"])
    assert "QUORUM_EXTRAS" in (ROOT / "scripts" / "install").read_text()
