"""adapters.spawn: a child started by vfork, its output and exit seen from either event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from adapters import spawn as spawn_mod
from adapters.spawn import spawn, with_parent_death_signal

pytestmark = pytest.mark.timeout(30)

LOOPS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}

# The child's own parent-death signal, read back with prctl(PR_GET_PDEATHSIG).
READ_PDEATHSIG = (
    "import ctypes; s = ctypes.c_int(); "
    "ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); print(s.value)"
)


async def _run(argv: list[str]) -> tuple[bytes, int]:
    child = await spawn(argv, dict(os.environ))
    out = b""
    while chunk := await child.read(65536):
        out += chunk
    return out, await child.wait()


@pytest.mark.parametrize("loop", LOOPS)
def test_output_and_exit_code_are_seen(loop: str) -> None:
    """The child's stdout and stderr arrive on one pipe and its exit code is read."""
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    out, code = LOOPS[loop](_run([sys.executable, "-c", script]))
    assert sorted(out.decode().split()) == ["err", "out"]  # stderr shares the pipe
    assert code == 3


@pytest.mark.parametrize("loop", LOOPS)
def test_killed_child_reads_as_negative_signal(loop: str) -> None:
    """A child killed by SIGKILL reads exit code -9."""

    async def kill() -> int:
        child = await spawn([sys.executable, "-c", "import time; time.sleep(60)"], os.environ)
        os.killpg(child.pid, signal.SIGKILL)  # its own process group
        code = await child.wait()
        child.close()
        return code

    assert LOOPS[loop](kill()) == -signal.SIGKILL


def _no_pidfd(pid: int) -> int:
    raise OSError("pidfd_open not supported")


def test_exit_is_seen_without_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without pidfd_open: a thread waits for the child instead."""
    monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    _, code = uvloop.run(_run([sys.executable, "-c", "raise SystemExit(7)"]))
    assert code == 7


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "waiting-thread"])
def test_the_childs_group_is_killed_at_its_exit_and_never_signalled_after_the_reap(
    pidfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that exits leaving a process in its group: that process is killed the moment
    the child exits, while the child is a zombie and the group id still its own; once the
    child is reaped, `signal_group` sends nothing (the number may be another session's)."""
    if not pidfd:
        monkeypatch.setattr(os, "pidfd_open", _no_pidfd)
    sent: list[tuple[int, int]] = []
    killpg = os.killpg

    def recorded(pgid: int, sig: int) -> None:
        sent.append((pgid, sig))
        killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", recorded)

    async def run() -> tuple[int, int, int, list[tuple[int, int]]]:
        child = await spawn(["sh", "-c", "sleep 60 & echo $!; exit 5"], os.environ)
        left = int((await child.read(100)).split()[0])
        code = await child.wait()
        at_exit = list(sent)
        child.signal_group(signal.SIGTERM)  # reaped: a no-op
        child.close()
        return child.pid, left, code, at_exit

    pid, left, code, at_exit = uvloop.run(run())
    assert code == 5
    assert at_exit == [(pid, signal.SIGKILL)]
    assert sent == at_exit
    deadline = time.monotonic() + 15
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(left)


@pytest.mark.parametrize("with_setpriv", [True, False], ids=["setpriv", "preexec_fn"])
def test_child_gets_sigkill_as_parent_death_signal(
    with_setpriv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is spawned with SIGKILL as its parent-death signal."""
    if with_setpriv and spawn_mod.SETPRIV is None:
        pytest.skip("util-linux setpriv is not installed")
    if not with_setpriv:
        monkeypatch.setattr(spawn_mod, "SETPRIV", None)
    out, code = uvloop.run(_run([sys.executable, "-c", READ_PDEATHSIG]))
    assert code == 0
    assert int(out) == signal.SIGKILL


def test_setpriv_keeps_the_command_and_needs_no_preexec_fn() -> None:
    """No preexec_fn, so Popen spawns with vfork (a fork of the runner costs ms per load)."""
    if spawn_mod.SETPRIV is None:
        pytest.skip("util-linux setpriv is not installed")
    argv, preexec = with_parent_death_signal(["llama-server", "-m", "x.gguf"])
    assert argv[-3:] == ["llama-server", "-m", "x.gguf"]
    assert preexec is None


def test_unstartable_command_exits_127_with_the_reason_through_setpriv() -> None:
    """setpriv execs the command: a missing one is setpriv's exit 127 and its message."""
    if spawn_mod.SETPRIV is None:
        pytest.skip("util-linux setpriv is not installed")
    out, code = uvloop.run(_run(["/nonexistent/engine"]))
    assert code == 127
    assert b"/nonexistent/engine" in out


def test_unstartable_command_raises_oserror_without_setpriv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without setpriv, a command that cannot start raises OSError at spawn."""
    monkeypatch.setattr(spawn_mod, "SETPRIV", None)
    with pytest.raises(OSError):
        uvloop.run(_run(["/nonexistent/engine"]))


_RUNNER_THAT_SPAWNS = """
import asyncio
from adapters.spawn import spawn

async def main():
    # The engine forks a grandchild (as vLLM's API server forks its EngineCore) and prints
    # its pid; the runner says both pids, then waits to be killed.
    child = await spawn(["sh", "-c", "sleep 300 & echo $!; wait"], {"PATH": "/usr/bin:/bin"})
    grandchild = (await child.read(100)).decode().strip()
    print(child.pid, grandchild, flush=True)
    await asyncio.sleep(300)

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_runner_killed_takes_the_engines_whole_group_along() -> None:
    """A runner killed with SIGKILL: the engine it spawned dies (parent-death signal) and so
    does what the engine forked (the guard kills the engine's process group)."""
    with subprocess.Popen(
        [sys.executable, "-c", _RUNNER_THAT_SPAWNS], stdout=subprocess.PIPE
    ) as runner:
        assert runner.stdout is not None
        engine, grandchild = (int(x) for x in runner.stdout.readline().split())
        assert _alive(engine) and _alive(grandchild)
        runner.kill()
    deadline = time.monotonic() + 15
    while (_alive(engine) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(engine) and not _alive(grandchild)
