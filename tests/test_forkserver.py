"""The fork server starts what the tests start as `python -m` would: the child's argv,
environment, working folder, stdio and session are its own, its exit status is the one
`subprocess.Popen` reports, and it holds no descriptor of the server's."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile

import pytest

from tests.support.forkserver import REPO_ROOT, Forked, spawn

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        os.environ.get("QUORUM_TEST_FORK") == "0", reason="QUORUM_TEST_FORK=0: no fork server"
    ),
]

PROBE = "tests.fixtures.fork_probe"


def _run(*args: str, env: dict[str, str] | None = None, new_session: bool = False) -> str:
    with tempfile.TemporaryFile() as out:
        proc = spawn(
            PROBE,
            args,
            env=env or {"WHO": "child"},
            stdout=out,
            stderr=subprocess.STDOUT,
            new_session=new_session,
        )
        assert isinstance(proc, Forked)
        assert proc.wait(30) == 0
        out.seek(0)
        return out.read().decode()


def test_the_child_runs_the_module_as_main_with_its_own_argv_env_and_folder() -> None:
    """argv[1:] are the arguments, `__name__` is `__main__`, the environment is exactly the
    one given, the working folder the repository's."""
    lines = dict(line.split("=", 1) for line in _run("a", "b c").splitlines())
    assert lines["name"] == "__main__"
    assert lines["args"] == "['a', 'b c']"
    assert lines["env"] == "{'WHO': 'child'}"
    assert lines["cwd"] == str(REPO_ROOT)


def test_the_child_holds_only_its_own_stdio() -> None:
    """No socket, pipe or file of the server's is open in the child: fds 0-2 only."""
    lines = dict(line.split("=", 1) for line in _run("fds").splitlines())
    assert lines["fds"] == "[0, 1, 2]"
    assert lines["stdin"] == os.devnull


def test_a_new_session_is_its_own_process_group() -> None:
    """`new_session` makes the child a session and group leader, as `start_new_session`."""
    lines = dict(line.split("=", 1) for line in _run(new_session=True).splitlines())
    assert lines["pgid"] == lines["pid"] == lines["sid"]


def test_exit_codes_and_signals_are_reported_as_popen_reports_them() -> None:
    """`sys.exit(3)` is 3; a SIGKILL is -9; `poll` is None while it runs and
    `wait(timeout)` raises TimeoutExpired."""
    assert spawn(PROBE, ["exit", "3"], env={}).wait(30) == 3
    proc = spawn(PROBE, ["sleep"], env={}, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"sleeping\n"  # started: it is past its imports
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.05)
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    proc.kill()  # a reaped child is never signalled again (its pid may be reused)
    proc.stdout.close()


def test_atexit_handlers_run_when_the_child_returns() -> None:
    """The child ends as an interpreter does: its atexit handlers run."""
    assert "atexit ran" in _run("atexit")
