"""The groups of `--dist loadgroup` (scripts/test, tests/conftest.py) reach pytest-xdist's
scheduler: a module's tests run on one worker, so its module fixtures (a runner, a real
engine) start once; the tests that start the real vLLM share one group, the other
real-engine tests another, so at most one vLLM and one other real engine run at once."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import real_engines
from tests.support.runner_proc import REPO_ROOT

pytestmark = pytest.mark.timeout(180)

RAN = re.compile(r"^\[(gw\d+)\] \[ *\d+%\] PASSED (\S+) *$", re.MULTILINE)

GROUPS = """
import sys, pytest
class Groups:
    def pytest_collection_finish(self, session):
        for item in session.items:
            print("GROUP", item.get_closest_marker("xdist_group").args[0], item.nodeid)
argv = ["-p", "no:cacheprovider", "--collect-only", "-q", *sys.argv[1:]]
sys.exit(pytest.main(argv, plugins=[Groups()]))
"""


def test_loadgroup_runs_a_modules_tests_on_one_worker() -> None:
    """Two workers, `--dist loadgroup`: every test of a module runs on the same worker, and
    its reported nodeid carries its group."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_lock.py", "-n", "2", "--dist", "loadgroup",
         "-v", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = RAN.findall(done.stdout)
    assert len(ran) >= 2, done.stdout[-3000:]
    assert len({worker for worker, _ in ran}) == 1, ran
    assert all(nodeid.endswith("@tests/test_lock.py") for _, nodeid in ran), ran


def test_vllm_tests_in_one_group_the_other_real_engines_in_another() -> None:
    """A test that starts the real vLLM (its fixture, or a real vLLM parameter) is in the
    vLLM group; one that starts llama-server or faster-whisper in the other real group; a
    test on fakes in its module's."""
    files = [
        "tests/runner/engines/test_crash_contract.py",
        "tests/runner/lifecycle/test_adapter_ops_vllm_real.py",
        "tests/runner/engines/test_llama_real.py",
        "tests/runner/http/test_chat.py",
    ]
    done = subprocess.run(
        [sys.executable, "-c", GROUPS, *files],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    groups: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("GROUP "):
            _, group, nodeid = line.split(" ", 2)
            groups.setdefault(group, set()).add(nodeid)
    vllm, others = groups[real_engines.GROUP_VLLM], groups[real_engines.GROUP_OTHERS]
    assert {t.split("::")[0] for t in vllm} == {
        "tests/runner/engines/test_crash_contract.py",
        "tests/runner/lifecycle/test_adapter_ops_vllm_real.py",
    }
    assert {t.split("[")[1] for t in vllm if "crash_contract" in t} == {
        "vllm-restart]",
        "vllm-no-restart]",
    }
    assert any("test_llama_real.py" in t for t in others)
    assert any("[llama-server-restart]" in t for t in others)
    assert any("[faster-whisper-restart]" in t for t in others)
    assert not any("vllm" in t.split("[")[-1] for t in others if "crash_contract" in t)
    assert all(
        t.startswith("tests/runner/http/test_chat.py::")
        for t in groups["tests/runner/http/test_chat.py"]
    )
    assert not any("test_chat.py" in t for t in vllm | others)
