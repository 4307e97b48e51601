"""The README's quick start, run as a newcomer types it (issue 28): every block README.md
marks `<!-- tested: -->` (its curl lines, `quorum status`, the Python client snippet)
against a runner started as `scripts/run` starts it: `quorum serve` with no models file set
(the repository's models.yaml: the real llama-server preloading SmolLM2), in-memory state,
on a free port instead of 8080. `curl` fails on an HTTP error status, and each `# →` line
must be in what its command printed: when the README and the runner disagree, this fails.
The blocks are read from README.md itself (tests/docs/readme.py), so editing the README
changes what is tested."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator

import httpx
import pytest

from tests.docs import readme
from tests.docs.readme import Block, in_order, python_expectations, shell_commands
from tests.support.ports import free_port
from tests.support.real_engines import LlamaServer
from tests.support.runner_proc import REPO_ROOT

pytestmark = pytest.mark.timeout(400)

README = REPO_ROOT / "README.md"
READY_S = 240.0
"""The preload takes seconds on an idle machine, far longer on a busy one."""
CLEARED = ("MODELS_CONFIG", "REDIS_URL", "TENANTS_FILE", "GOVERNANCE_REGISTRY", "API_KEYS")
"""Settings a newcomer's shell does not have: the runner runs on its defaults."""


def _quorum() -> list[str]:
    """The `quorum` console script, as pyproject.toml declares it."""
    target = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = target["quorum"].split(":")
    code = f"import sys; from {module} import {func}; sys.argv[0] = 'quorum'; sys.exit({func}())"
    return [sys.executable, "-c", code]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith((*CLEARED, "TENANT_"))}
    return {**env, "COLUMNS": "160"}  # `quorum status`'s table, unwrapped


def _ready(url: str) -> bool:
    try:
        caps = httpx.get(url + "/v1/capabilities", timeout=5)
    except httpx.TransportError:
        return False
    return caps.status_code == 200 and bool(caps.json()["models"]["loaded"])


@pytest.fixture(scope="module")
def runner(
    real_llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`quorum serve` as scripts/run execs it, on a free loopback port; its address."""
    port = free_port()
    log = tmp_path_factory.mktemp("readme") / "runner.log"
    env = {**_env(), "PORT": str(port), "HOST": "127.0.0.1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*_quorum(), "serve"], env=env, stdout=out, stderr=subprocess.STDOUT,
            cwd=REPO_ROOT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while not _ready(url):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"not ready in {READY_S} s:\n{log.read_text()}"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _blocks(address: str) -> list[Block]:
    blocks = readme.tested_blocks(README.read_text(), address)
    shell = "\n".join(b.text for b in blocks if b.lang == "sh")
    assert "curl" in shell and "/v1/chat/completions" in shell and "quorum status" in shell
    assert [b for b in blocks if b.lang == "python"], "the client snippet is tested"
    return blocks


SHELL_PRELUDE = """
set -o pipefail
curl() { command curl --silent --show-error --fail-with-body "$@"; }
quorum() { %s "$@"; }
"""


def _run_shell(block: Block) -> None:
    quorum = shlex.join(_quorum())
    for command in shell_commands(block):
        script = SHELL_PRELUDE % quorum + command.text + "\n"
        done = subprocess.run(
            ["bash", "-c", script], env=_env(), capture_output=True, text=True, timeout=180
        )
        said = f"{command.text}\n-> exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert done.returncode == 0, said
        assert in_order(done.stdout, command.expect) == [], said


def _run_python(block: Block) -> None:
    done = subprocess.run(
        [sys.executable, "-c", block.text],
        env=_env(), capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
    )  # fmt: skip
    said = f"{block.text}\n-> exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, said
    assert in_order(done.stdout, python_expectations(block)) == [], said


def test_readme_quick_start_runs_against_the_default_runner(runner: str) -> None:
    """Each tested block of README.md runs as written (the address aside) against the
    runner scripts/run starts, and prints what the README says it prints."""
    for block in _blocks(runner):
        if block.lang == "sh":
            _run_shell(block)
        elif block.lang == "python":
            _run_python(block)
        else:
            pytest.fail(f"a tested block of README.md in {block.lang}: sh or python only")


def test_readme_blocks_are_read_from_the_readme() -> None:
    """What is tested is what README.md says: commands with their continuations and their
    `# →` lines, Python with its own, untested blocks left alone."""
    text = (
        "```sh\nuntested\n```\n"
        "<!-- tested: here -->\n```sh\n"
        "curl localhost:8080/a \\\n  -d x  # why\n# → one\n# → two\nquorum status\n```\n"
        "<!-- tested: here -->\n```python\nprint(1)\n    # → 1\n```\n"
    )
    sh, py = readme.tested_blocks(text, "127.0.0.1:9")
    [curl, status] = shell_commands(sh)
    assert curl.text == "curl 127.0.0.1:9/a \\\n  -d x  # why" and curl.expect == ["one", "two"]
    assert (status.text, status.expect) == ("quorum status", [])
    assert python_expectations(py) == ["1"]
    assert in_order("one two", ["one", "two"]) == [] and in_order("two one", ["one", "two"])
