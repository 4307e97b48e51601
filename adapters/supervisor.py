"""The engine-process supervisor: one child process per engine, watched for life.

An `EngineProcess` owns one child (llama-server, vllm, a speech worker, ...):

- it runs in its own process group (`start_new_session`), with the parent-death signal set
  (`PR_SET_PDEATHSIG` = SIGKILL), so it dies with the runner even when the runner is killed
  with SIGKILL; a clean runner exit stops it with SIGTERM, a grace period, then SIGKILL
  (how it is spawned, by vfork, and watched: `adapters/spawn.py`);
- its stdout and stderr go to a bounded ring buffer of lines (`logs()`), shown in failure
  reasons and at `GET /v1/models/{id}/logs`;
- `start()` polls the adapter's health check until it says ready, within the load timeout:
  a slow load is not a failure until the timeout, a process that exits first fails at once;
- a process that exits on its own is a crash: the state turns FAILED with its exit code and
  `on_exit` callbacks run at once (the pool reports the crash, the scheduler holds or
  refuses the queued requests), before anyone awaiting the exit hears of it (in-flight
  requests see their connections reset and answer 502 `engine_crashed`);
- a READY process the runner finds hung (it stops answering its probe) is ended with
  `kill(cause)`: SIGKILL to its group, and that exit is a crash described by the cause.

States and their guarded transitions (an illegal one raises `IllegalEngineTransition`)::

    NEW ──start()──▶ STARTING ──healthy──▶ READY ──stop()──▶ STOPPING ──▶ STOPPED
                        │                   │                    ▲
                        ├─exit / timeout──▶ FAILED ──stop()──────┘
                        └─stop()──▶ STOPPING          (READY ──exit──▶ FAILED)

Only this class moves its state; everyone else reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import shutil
import signal
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from adapters.environment import engine_environment
from adapters.errors import EngineStartFailed, IllegalEngineTransition
from adapters.spawn import Child, spawn

log = logging.getLogger("quorum.supervisor")

HealthCheck = Callable[[], Awaitable[bool]]
"""Answers whether the engine is ready to serve; raising counts as "not yet"."""

_MAX_LINE = 4096
_DRAIN_S = 1.0  # how long the output of a process that ended is read for, at most
# After a failed exchange, how long to wait to learn whether the engine process died: a
# killed llama-server's sockets close before it is reaped, by over half a second on a busy
# host; answering before that calls a crash "unreachable" (issue 17).
DEATH_GRACE_S = 2.0


class EngineState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


_ALLOWED: dict[EngineState, frozenset[EngineState]] = {
    EngineState.NEW: frozenset({EngineState.STARTING}),
    EngineState.STARTING: frozenset({EngineState.READY, EngineState.FAILED, EngineState.STOPPING}),
    EngineState.READY: frozenset({EngineState.FAILED, EngineState.STOPPING}),
    EngineState.STOPPING: frozenset({EngineState.STOPPED}),
    EngineState.FAILED: frozenset({EngineState.STOPPING, EngineState.STOPPED}),
    EngineState.STOPPED: frozenset(),
}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the engine binds it a moment later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LogRing:
    """The last `max_lines` lines of a process's output, each cut at 4 KiB."""

    def __init__(self, max_lines: int = 500) -> None:
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._partial = b""
        self.total_lines = 0

    def feed(self, data: bytes) -> None:
        data = self._partial + data
        *lines, rest = data.split(b"\n")
        self._partial = rest[-_MAX_LINE:]
        for line in lines:
            self._lines.append(line[:_MAX_LINE].decode(errors="replace").rstrip("\r"))
            self.total_lines += 1

    def close(self) -> None:
        if self._partial:
            self.feed(b"\n")

    def tail(self, n: int | None = None) -> list[str]:
        lines = list(self._lines)
        return lines if n is None else lines[-n:]


@dataclass
class ExitInfo:
    """How the process ended: `returncode` as Popen gives it (negative = killed by signal).

    `cause`: why the runner killed it, when it judged the process broken (`kill`: it hung);
    the exit is still a crash, described by that cause."""

    returncode: int
    expected: bool  # True when stop() asked for it
    cause: str | None = None

    def describe(self) -> str:
        if self.cause is not None:
            return f"{self.cause} (SIGKILL, exit code {self.returncode})"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            return f"killed by {name} (exit code {self.returncode})"
        return f"exit code {self.returncode}"


@dataclass
class EngineProcess:
    """One supervised engine child process. See the module docstring for its states."""

    name: str
    argv: Sequence[str]
    health: HealthCheck
    env: Mapping[str, str] = field(default_factory=dict)  # set for this engine: wins
    inherit: tuple[str, ...] = ()  # what it takes of the runner's environment beyond
    # adapters/environment.py's COMMON: its kind's `Traits.environment`
    load_timeout_s: float = 120.0
    poll_interval_s: float = 0.025
    ready_marker: bytes | None = None  # a line the engine prints when it serves (a hint)
    log_lines: int = 500
    logs_of: str | None = None  # the model whose `GET /v1/models/{id}/logs` shows it: `name`
    clock: Callable[[], float] = time.monotonic
    state: EngineState = field(default=EngineState.NEW, init=False)
    exit: ExitInfo | None = field(default=None, init=False)
    pid: int | None = field(default=None, init=False)
    started_at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.ring = LogRing(self.log_lines)
        self._proc: Child | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiter: asyncio.Task[None] | None = None
        self._exited = asyncio.Event()
        self._marker_seen = asyncio.Event()
        self._on_exit: list[Callable[[EngineProcess], None]] = []
        self._exit_handled = False  # the callbacks have run: a late one is called at once
        self._stop_requested = False
        self._kill_cause: str | None = None

    # -- reading -------------------------------------------------------------------

    def logs(self, n: int | None = None) -> list[str]:
        return self.ring.tail(n)

    def failed(self, what: str, lines: int = 20) -> str:
        """`what` happened: the runner's log gets it with the engine's last `lines` lines of
        output (for operators; `GET /v1/models/{id}/logs` for admins); the answer is `what`
        alone, with where to read the rest (fit for any tenant: no engine output in it)."""
        tail = self.logs(lines)
        log.error(
            "engine %s: %s; last log lines:\n%s", self.name, what, "\n".join(tail) or "(none)"
        )
        model = self.logs_of or self.name
        return f"{what}; its log is at GET /v1/models/{model}/logs (admins)"

    def on_exit(self, callback: Callable[[EngineProcess], None]) -> None:
        """Call `callback(self)` once the process has exited, whatever the reason; if its
        exit was already handled (it died before the caller got round to asking), soon."""
        if self._exit_handled:
            asyncio.get_running_loop().call_soon(callback, self)
            return
        self._on_exit.append(callback)

    # -- acting ----------------------------------------------------------------------

    def _move(self, to: EngineState) -> None:
        if to not in _ALLOWED[self.state]:
            raise IllegalEngineTransition(
                f"engine {self.name!r}: {self.state.value} -> {to.value} is not allowed"
            )
        log.debug("engine %s: %s -> %s", self.name, self.state.value, to.value)
        self.state = to

    async def start(self) -> None:
        """Spawn the process and wait until healthy.

        1. Spawn in its own process group with the parent-death signal; output to the ring.
        2. Poll `health` every `poll_interval_s` until it answers True: READY.
        3. The process exits first: FAILED, `EngineStartFailed` with its exit code and log.
        4. `load_timeout_s` passes first: the process is stopped, FAILED, `EngineStartFailed`.
        Cancelling `start()` (a cancelled load) stops the process.
        """
        self._move(EngineState.STARTING)
        env = engine_environment(os.environ, self.inherit, self.env)
        # 1
        if shutil.which(self.argv[0], path=env.get("PATH")) is None:
            raise self._not_spawned(f"{self.argv[0]!r} is not an executable file")
        try:
            self._proc = await spawn(self.argv, env)
        except OSError as exc:
            raise self._not_spawned(str(exc)) from None
        self.pid = self._proc.pid
        self.started_at = self.clock()
        self._reader = asyncio.create_task(self._read_output(), name=f"engine-log-{self.name}")
        self._waiter = asyncio.create_task(self._wait_exit(), name=f"engine-wait-{self.name}")
        deadline = self.started_at + self.load_timeout_s
        try:
            while True:
                if self._exited.is_set():  # 3
                    assert self.exit is not None
                    await self._drain_output()
                    raise EngineStartFailed(
                        self.failed(
                            f"engine {self.name!r} exited while starting ({self.exit.describe()})"
                        ),
                        exit_code=self.exit.returncode,
                        log=self.logs(),
                    )
                if await self._healthy():  # 2
                    if self._exited.is_set():
                        continue
                    self._move(EngineState.READY)
                    return
                if self.clock() >= deadline:  # 4
                    await self._terminate(grace_s=2.0)
                    self._move(EngineState.FAILED)
                    raise EngineStartFailed(
                        self.failed(
                            f"engine {self.name!r} did not become healthy within "
                            f"{self.load_timeout_s:g} s"
                        ),
                        log=self.logs(),
                    )
                await self._until_worth_polling()
        except asyncio.CancelledError:
            await self.stop(grace_s=2.0)
            raise

    def _not_spawned(self, why: str) -> EngineStartFailed:
        """No process came to be: FAILED with exit code 127 (the shell's "cannot run")."""
        self._move(EngineState.FAILED)
        self.exit = ExitInfo(127, expected=False)
        self._exited.set()
        return EngineStartFailed(f"engine {self.name!r} could not be started: {why}")

    async def _healthy(self) -> bool:
        try:
            return await self.health()
        except Exception:
            return False

    async def stop(self, grace_s: float = 10.0) -> ExitInfo | None:
        """SIGTERM the process group, wait `grace_s`, then SIGKILL it; idempotent."""
        if self.state in (EngineState.NEW, EngineState.STOPPED):
            return self.exit
        if self.state is not EngineState.STOPPING:
            self._move(EngineState.STOPPING)
        await self._terminate(grace_s)
        self._move(EngineState.STOPPED)
        return self.exit

    async def _terminate(self, grace_s: float) -> None:
        """End the process (SIGTERM, grace, SIGKILL) without judging it a crash."""
        self._stop_requested = True
        if self._proc is not None and not self._exited.is_set():
            self._signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self._exited.wait(), grace_s)
            except TimeoutError:
                log.warning("engine %s ignored SIGTERM for %g s: SIGKILL", self.name, grace_s)
                self._signal(signal.SIGKILL)
                await self._exited.wait()
        await self._drain_output()

    def kill(self, cause: str) -> bool:
        """End a READY process the runner judged broken (it stopped answering): SIGKILL its
        whole group now. Its exit is a crash like any other (FAILED, the `on_exit`
        callbacks), described by `cause`. False (nothing done) when it is not READY."""
        if self.state is not EngineState.READY or self._kill_cause is not None:
            return False
        self._kill_cause = cause
        self._signal(signal.SIGKILL)
        return True

    def _signal(self, sig: signal.Signals) -> None:
        """To the engine's process group while it has one (never once the engine is
        reaped: its group id may be another session's by then)."""
        if self._proc is not None:
            self._proc.signal_group(sig)

    # -- background tasks ------------------------------------------------------------

    async def _until_worth_polling(self) -> None:
        """Wait before the next health check: until the process exits, or, for an engine
        with a `ready_marker`, until it prints it (checked every 10 poll intervals anyway,
        in case a version prints something else); else one poll interval. Polling a
        loading engine costs the runner CPU the engine's load could use."""
        waits = [asyncio.ensure_future(self._exited.wait())]
        timeout = self.poll_interval_s
        if self.ready_marker is not None:
            waits.append(asyncio.ensure_future(self._marker_seen.wait()))
            timeout = self.poll_interval_s * 10
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _read_output(self) -> None:
        assert self._proc is not None
        child = self._proc
        marker = self.ready_marker
        while True:
            data = await child.read(65536)
            if not data:
                break
            self.ring.feed(data)
            if marker is not None and marker in data:
                self._marker_seen.set()
        self.ring.close()

    async def _drain_output(self) -> None:
        """Wait (briefly) until the output reader has everything the process wrote."""
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), _DRAIN_S)

    async def _wait_exit(self) -> None:
        assert self._proc is not None
        code = await self._proc.wait()  # what it left in its group is gone (spawn.Child)
        expected = self._stop_requested
        killed = self._kill_cause is not None and code == -signal.SIGKILL
        self.exit = ExitInfo(code, expected, self._kill_cause if killed else None)
        if not expected and self.state in (EngineState.STARTING, EngineState.READY):
            if self.state is EngineState.READY:
                log.error("engine %s died: %s", self.name, self.exit.describe())
            self._move(EngineState.FAILED)
        await self._drain_output()
        self._proc.close()
        self._exit_handled = True
        for callback in self._on_exit:
            try:
                callback(self)
            except Exception:
                log.exception("engine %s: exit callback failed", self.name)
        # Last: whoever waits on the exit (a request whose connection the crash cut) hears
        # of it only after the callbacks reported the crash, so the scheduler knows the
        # model failed before that request's end frees its slot for a queued one.
        self._exited.set()

    async def died_within(self, seconds: float) -> str | None:
        """ "exited (<how>)" if the process ends (or has ended) within `seconds`, else None.

        A process already reaped whose exit callbacks are still to run (its output being
        drained, at most `_DRAIN_S`) is waited for past `seconds`: the answer comes after
        the crash was reported."""
        if self._proc is None:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._exited.wait()), seconds)
        if self.exit is not None and not self._exited.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited.wait()), _DRAIN_S + 1.0)
        if self.exit is None or self.exit.expected:
            return None
        return f"exited ({self.exit.describe()})"

    async def wait_exit(self) -> ExitInfo:
        await self._exited.wait()
        assert self.exit is not None
        return self.exit
