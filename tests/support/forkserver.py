"""Processes the tests start, forked from a Python that has already imported the code.

`python -m runner` spends about 0.8 s of CPU on imports before it does anything, and the
suite starts it a few hundred times, beside as many fake engines. A fork server (one per
test process, started at its first `spawn`) imports the runner's and the fakes' modules
once; each `spawn` then forks it, and the child runs the module as `python -m` would
(`runpy` as `__main__`, its argv, environment, working folder, its own stdin, stdout and
stderr, its own session when asked) and exits as the interpreter does, atexit handlers
included. The child is a real process of the real code; only the imports were done earlier.
The modules a child's code reads its configuration from read it when called, not when
imported, so nothing set for one child leaks into the next.

`Forked` is what the tests use of a `subprocess.Popen` (pid, poll, wait, send_signal,
terminate, kill, returncode, stdout). The server reaps its children and tells each
`Forked` its exit status as `Popen` gives it (a signal as its negative number).

The tests fork (tests/conftest.py sets QUORUM_TEST_FORK=1 unless it is set), but for the
real-engine tests (`popen_only`): they measure a runner's memory and its ways of stopping as
production has them, and a forked process maps the modules it shares with its parent only
as it touches them (its RSS grows at its first transcription, where a runner started anew
paid for PyAV at start). Outside pytest (the benchmarks), or with QUORUM_TEST_FORK=0,
every process starts with `subprocess.Popen`, as a user starts it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

REPO_ROOT = Path(__file__).resolve().parents[2]

PRELOAD = (
    # what `quorum serve` imports (runner/runtime/cli.py) and the engine kinds it may build
    "runner.runtime.cli",
    "runner.http.app",
    "runner.http.server",
    "runner.engines.kinds",
    "runner.jobs.webhooks",
    "runner.lifecycle.gate",
    "runner.runtime.safety",
    "adapters.llama_server.kind",
    "adapters.vllm.kind",
    "adapters.whisper.kind",
    "adapters.comfyui.kind",
    "adapters.openai.kind",
    "runner.runtime.logs",
    "av",
    "uvloop",
    "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.websockets.auto",
    "httpcore",
    "pydantic.v1",
    # what the fake engines share (tests/fixtures/_serve.py and its neighbours)
    "tests.fixtures._serve",
    "tests.fixtures._openai_shapes",
    "tests.fixtures._vllm_shapes",
    "tests.fixtures._comfy_routes",
)
_HEADER = struct.Struct("!I")


class Process(Protocol):
    """What the tests use of a started process: `subprocess.Popen` and `Forked` both are one."""

    pid: int
    returncode: int | None
    stdout: IO[bytes] | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


@dataclass
class Forked:
    """A child of the fork server; its exit status arrives on `conn` as one line."""

    args: list[str]
    pid: int
    conn: socket.socket
    stdout: IO[bytes] | None = None
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a pid the server has reaped (it may be reused)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self, timeout: float | None) -> bool:
        with selectors.DefaultSelector() as sel:
            sel.register(self.conn, selectors.EVENT_READ)
            if not sel.select(timeout):
                return False
        line = _read_line(self.conn)
        self.conn.close()
        self.returncode = int(line) if line else -signal.SIGKILL  # the server itself died
        return True


def _read_line(conn: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        data = conn.recv(64)
        if not data:
            break
        buf += data
    return buf.strip()


def spawn(
    module: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str],
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
    new_session: bool = False,
) -> Process:
    """Run `python -m module *args` from the repository root (stdin /dev/null);
    `stdout`/`stderr` a file, `subprocess.PIPE` (stdout only), `subprocess.STDOUT` (stderr
    only) or None (this process's own)."""
    argv = [sys.executable, "-m", module, *args]
    if _popen_only or os.environ.get("QUORUM_TEST_FORK") != "1":
        return subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=new_session,
        )
    opened: list[int] = [os.open(os.devnull, os.O_RDONLY)]
    reader: IO[bytes] | None = None
    if stdout == subprocess.PIPE:
        r, w = os.pipe()
        reader = os.fdopen(r, "rb")
        opened.append(w)
    else:
        opened.append(os.dup(_fd(stdout, 1)))
    opened.append(os.dup(opened[1]) if stderr == subprocess.STDOUT else os.dup(_fd(stderr, 2)))
    payload = json.dumps(
        {
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": str(REPO_ROOT),
            "new_session": new_session,
        }
    ).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_server_path())
        socket.send_fds(conn, [_HEADER.pack(len(payload))], opened)
        conn.sendall(payload)
        pid = int(_read_line(conn))
    except BaseException:
        conn.close()
        if reader is not None:
            reader.close()
        raise
    finally:
        for fd in opened:
            os.close(fd)
    return Forked(argv, pid, conn, reader)


def run(
    module: str, args: Sequence[str] = (), *, env: Mapping[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[bytes]:
    """`python -m module *args` to its end, its stdout and stderr captured, as
    `subprocess.run(..., capture_output=True, timeout=...)` gives them."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = spawn(module, args, env=env, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(
            [sys.executable, "-m", module, *args], code, out.read(), err.read()
        )


def _fd(target: int | IO[bytes] | None, default: int) -> int:
    if target is None:
        return default
    if isinstance(target, int):
        if target < 0:
            raise ValueError(f"unsupported stdio target {target}")
        return target
    return target.fileno()


_popen_only = False


def popen_only(on: bool) -> None:
    """While on, `spawn` starts everything with `subprocess.Popen` (tests/conftest.py: for
    the tests that run real engines)."""
    global _popen_only
    _popen_only = on


_lock = threading.Lock()
_server: tuple[int, subprocess.Popen[bytes], str] | None = None


def _server_path() -> str:
    """The socket of this process's fork server, started on first use (a forked pytest
    worker starts its own)."""
    global _server
    with _lock:
        if _server is None or _server[0] != os.getpid() or _server[1].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="quorum-fork-"), "s")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.forkserver", path],
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,  # its end of life: EOF when this process is gone
                stdout=subprocess.PIPE,
            )
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != b"READY":
                raise RuntimeError(f"fork server did not start (exit {proc.wait()})")
            _server = (os.getpid(), proc, path)
        return _server[2]


def stop() -> None:
    """End this process's fork server, if it started one (tests/conftest.py, at the end of
    the session): its stdin closes, it returns, it is reaped."""
    global _server
    with _lock:
        if _server is None or _server[0] != os.getpid():
            return
        proc, path = _server[1], _server[2]
        _server = None
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class _Child:
    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    new_session: bool
    fds: list[int]


def _receive(conn: socket.socket) -> _Child:
    head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    (size,) = _HEADER.unpack(head)
    payload = b""
    while len(payload) < size:
        data = conn.recv(size - len(payload))
        if not data:
            raise ConnectionError("spawn request cut short")
        payload += data
    spec = json.loads(payload)
    return _Child(spec["module"], spec["args"], spec["env"], spec["cwd"], spec["new_session"], fds)


def _serve(path: str) -> _Child | None:
    """Accept spawn requests until stdin closes; returns only in a forked child."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    child = _receive(conn)
                except (OSError, ValueError):
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for other in waiting.values():
                        other.close()
                    conn.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    return child
                for fd in child.fds:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    conn.sendall(b"%d\n" % pid)
                waiting[pid] = conn
            elif key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(waiting)
            elif not os.read(sys.stdin.fileno(), 4096):
                return None  # the test process is gone


def _reap(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            conn.close()


def _become(child: _Child) -> None:
    """Turn this forked process into `python -m child.module *child.args`."""
    for target, fd in enumerate(child.fds):
        os.dup2(fd, target)
    for fd in set(child.fds):
        if fd > 2:
            os.close(fd)
    if child.new_session:
        os.setsid()
    os.chdir(child.cwd)
    os.environ.clear()
    os.environ.update(child.env)
    if child.env.get("PYTHONFAULTHANDLER"):  # as `python` does when it starts
        faulthandler.enable()
    sys.argv = [child.module, *child.args]
    runpy.run_module(child.module, run_name="__main__", alter_sys=True)


def main() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    sys.stdout.flush()
    child = _serve(sys.argv[1])
    if child is not None:
        _become(child)


if __name__ == "__main__":
    main()
