"""Ending the process group of a server a test started itself (`start_new_session=True`).

A group may be signalled only while its leader is not reaped: once `poll()` or `wait()`
has reaped it, its pid, and the group id that is the same number, may be given to any new
process, and a new session (another worker's runner, say) would get it as its group id.
`Popen` reaps only when asked, so "not reaped yet" is "`poll()` says it runs", or has just
exited and waits, a zombie, for this process to reap it. (A child of the fork server is
reaped by the server, which tells its `poll()` at once.)
"""

from __future__ import annotations

import contextlib
import os
import signal

from tests.support.forkserver import Process


def end_group(proc: Process, sig: int = signal.SIGKILL, timeout: float | None = 10.0) -> None:
    """Send `sig` to `proc`'s group unless `proc` is reaped already, then reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
    proc.wait(timeout)
