"""How an engine child process is started and watched from the event loop.

`spawn()` starts the child with `subprocess.Popen`, not the event loop's own
`create_subprocess_exec`: under uvloop that is libuv's `uv_spawn`, a full `fork()` of the
runner, whose cost grows with the runner's memory (page tables copied, then copy-on-write
faults); measured 11 ms per spawn for a 100 MB runner, 14 ms at 300 MB, inside every cold
load. CPython's `Popen` spawns with `vfork()` (0.3-3 ms at any size) as long as no
`preexec_fn` is given, so the parent-death signal is set by util-linux's `setpriv` (which
execs the command: same pid, the runner stays its parent); only without `setpriv` does a
`preexec_fn` set it, and Popen forks.

The child's output is read through the loop (`connect_read_pipe`); its exit is seen through
a pidfd the loop watches (Linux 5.3+), else by a thread blocked in `waitid(WNOWAIT)`. Its
process group is handed to the runner's guard (`reaper.py`), which kills the whole group
should the runner die first: the parent-death signal reaches the child only, not what it
forked.

Signals go to the child's group only while the child is not reaped. Once it is, its pid,
and the group id that is the same number, may be given to any new process: a new session
started elsewhere on the machine gets it as its group id, and a late `killpg` would end
that session instead (a runner that stops an engine long dead, for one). So what the
child left in its group is killed the moment it exits, while it is still a zombie and the
number still its own, and only then is it reaped, always on the loop's thread, where
`signal_group` reads whether it has been.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

from adapters.reaper import GUARD

_PR_SET_PDEATHSIG = 1
SETPRIV = shutil.which("setpriv")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """In the child: ask the kernel to SIGKILL it when the runner's thread dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def with_parent_death_signal(
    argv: Sequence[str],
) -> tuple[list[str], Callable[[], None] | None]:
    """The command, made to die with the runner (SIGKILL when the runner's thread ends):
    `setpriv --pdeathsig KILL -- cmd` when util-linux is there, else a `preexec_fn`."""
    if SETPRIV is not None:
        return [SETPRIV, "--pdeathsig", "KILL", "--", *argv], None
    return list(argv), _die_with_parent


class Child:
    """A running child process: its output read in chunks, its exit as an awaitable."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        stdout: asyncio.StreamReader,
        transport: asyncio.BaseTransport,
    ) -> None:
        self.popen = popen
        self.pid = popen.pid
        self._stdout = stdout
        self._transport = transport
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pidfd: int | None = None

    async def read(self, n: int) -> bytes:
        """Up to `n` bytes of output; b"" once the child closed it (the pipe is closed then)."""
        data = await self._stdout.read(n)
        if not data:
            self._transport.close()
        return data

    async def wait(self) -> int:
        """The exit status as Popen gives it (negative = killed by that signal)."""
        return await asyncio.shield(self._exited)

    def signal_group(self, sig: signal.Signals) -> None:
        """Send `sig` to the child's process group, unless the child has been reaped (the
        group's id may belong to someone else by then; what the group held was killed
        when the child exited)."""
        if self.popen.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def close(self) -> None:
        """Stop reading its output and watching it (after it exited and was drained, and
        its group was killed): the guard forgets its group."""
        self._transport.close()
        self._unwatch()
        GUARD.forget(self.pid)

    def _watch_exit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # not Linux 5.3+: a thread waits instead
            waiting = loop.create_task(asyncio.to_thread(_until_exited, self.pid))
            waiting.add_done_callback(lambda _: self._reap())
            return
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        """The child exited (a zombie: its pid and group id still its own): kill what it
        left in its group (vLLM's EngineCore and worker outlive their API server), then
        reap it."""
        self.signal_group(signal.SIGKILL)
        code = self.popen.poll()
        if code is not None:
            self._unwatch()
            self._set_exit(code)

    def _unwatch(self) -> None:
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _set_exit(self, code: int) -> None:
        if not self._exited.done():
            self._exited.set_result(code)


def _until_exited(pid: int) -> None:
    """Block until `pid` has exited, leaving it a zombie (not reaped)."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except InterruptedError:
            continue
        except ChildProcessError:  # reaped already: nothing left to wait for
            return


async def spawn(argv: Sequence[str], env: Mapping[str, str]) -> Child:
    """Start `argv` in its own process group (session), stdout and stderr on one pipe, with
    the parent-death signal; OSError when it cannot be started."""
    full_argv, preexec = with_parent_death_signal(argv)
    popen = subprocess.Popen(
        full_argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        start_new_session=True,
        preexec_fn=preexec,
    )
    assert popen.stdout is not None
    loop = asyncio.get_running_loop()
    stdout = asyncio.StreamReader(limit=2**20)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stdout), popen.stdout
        )
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        raise
    GUARD.watch(popen.pid)  # its group: the child's pid (start_new_session)
    child = Child(popen, stdout, transport)
    child._watch_exit()
    return child
