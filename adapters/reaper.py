"""The guard that ends an engine's whole process group when the runner dies.

The parent-death signal (`spawn.py`) kills the process the runner started, not that
process's own children: vLLM's API server forks its EngineCore, which forks a worker, and
when the API server is killed those two go on with init as their parent, holding the
model's gigabytes (seen with the real vLLM CPU build: a runner killed with SIGKILL left its
`VLLM::EngineCore` and `VLLM::Worker` running).

One guard per runner process: a small `sh` reading process-group ids from a pipe. The
runner writes `+PGID` when an engine starts and `-PGID` once its group is gone. However the
runner ends (SIGKILL included), the kernel closes the pipe's write end; the guard reads EOF,
SIGKILLs every group still listed, and exits. It runs in a session of its own and without
the parent-death signal, so the runner's death does not take it along; the pipe's write end
is not inheritable, so no engine holds it open.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading

GUARD_SCRIPT = """
pgs=" "
while IFS= read -r line; do
  case "$line" in
    +*) pgs="$pgs${line#+} " ;;
    -*) keep=" "; for p in $pgs; do [ "$p" = "${line#-}" ] || keep="$keep$p "; done
        pgs="$keep" ;;
  esac
done
for p in $pgs; do kill -s KILL -- "-$p" 2>/dev/null; done
"""


class GroupGuard:
    """Process groups to SIGKILL if the runner dies before it ended them (started lazily)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def watch(self, pgid: int) -> None:
        """Kill group `pgid` if the runner dies from now on."""
        self._send(f"+{pgid}\n")

    def forget(self, pgid: int) -> None:
        """Group `pgid` has ended (its id may be reused): never kill it."""
        self._send(f"-{pgid}\n")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                if line.startswith("-"):
                    return  # a guard that is gone holds nothing to forget
                self._proc = subprocess.Popen(
                    ["sh", "-c", GUARD_SCRIPT],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            assert self._proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()


GUARD = GroupGuard()
"""The runner's one guard (every engine spawned through `spawn.spawn` is watched)."""
