"""`WhisperEngine`: the runner's side of one speech worker process.

    engine = WhisperEngine("whisper-tiny.en", "/path/to/ctranslate2-model", parallel=2)
    await engine.start()                      # spawn, wait for Ready (load timeout)
    async with engine.transcribe(path, request_id="r1") as t:
        info = await t.wait_info()            # duration, language
        async for segment in t:               # each one as the worker produces it
            ...
    t.done.engine_ms                          # the worker's wall time on it
    await engine.stop()                       # the process ends: its memory returns

Leaving the `async with` early (an exception, a cancelled task: the client went away)
sends `Cancel`, and the worker stops decoding at its next segment.

**Channel.** The worker connects to a Unix socket the engine listens on, in a private
0700 directory made for this engine. Not the worker's stdout: the supervisor owns
stdout and stderr for its log ring, and CTranslate2, onnxruntime and Python warnings
write there. Not an inherited fd: `EngineProcess` passes none, and a path needs no
change to it. A second connection is refused, so only the worker we spawned talks.

**Crash.** The worker dying (the socket reaches EOF, or the supervisor sees the exit)
fails every transcription in flight at once with `EngineCrashed`, which names the exit
code or signal; `failure` keeps that reason and `on_crash` callbacks run once. An engine
does not restart itself: the model pool starts a new `WhisperEngine`.

**Silence.** A transcription that hears nothing from the worker for `silence_s`
(ENGINE_READ_TIMEOUT_S) between two of its messages (from `Transcribe` to `Info`, between
segments, to `Done`) means the worker is stuck: its decoding thread sits in a CTranslate2
call that nothing can interrupt, and it holds a slot. `silent` kills the worker
(`EngineProcess.kill`: SIGKILL to its group), so what follows is the crash above, and
that transcription ends `EngineSilent` (504 `engine_timeout`) once the exit was heard.

The lifecycle state is the supervisor's (`EngineProcess.state`), read through `state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from adapters.errors import (
    EngineBadResponse,
    EngineCrashed,
    EngineError,
    EngineSilent,
    EngineUnavailable,
)
from adapters.speech import Info, Segment
from adapters.supervisor import EngineProcess, EngineState
from adapters.whisper.messages import (
    HEADER_SIZE,
    Cancel,
    Done,
    Message,
    ProtocolError,
    Ready,
    Shutdown,
    Transcribe,
    decode,
    encode,
    frame_length,
)
from adapters.whisper.transcription import Transcription
from faults import QuorumError

log = logging.getLogger("quorum.whisper")

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
WHISPER_ENVIRONMENT = ("HF_*", "HUGGING_FACE_HUB_TOKEN", "CT2_*")
"""What the speech worker takes of the runner's environment (`Traits.environment`): the
Hub's settings (a download's token) and CTranslate2's."""
_EXIT_WAIT_S = 2.0


class WhisperEngine:
    """One Whisper model in one supervised worker process; `slots` = `parallel`."""

    def __init__(
        self,
        model_id: str,
        model: str,
        *,
        device: str = "cpu",
        compute_type: str = "int8",
        parallel: int = 1,
        cpu_threads: int = 0,
        load_timeout_s: float = 120.0,
        download_root: str | None = None,
        allow_download: bool = False,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        log_lines: int = 500,
        silence_s: float | None = 300.0,
    ) -> None:
        """`silence_s`: the longest wait for a transcription's next message (see Silence
        in the module docstring); None waits for ever."""
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self.model_id = model_id
        self.model = model
        self.slots = parallel
        self.silence_s = silence_s
        self.failure: str | None = None
        self.cut: QuorumError | None = None  # set when stopped under transcriptions: theirs
        self.ready: Ready | None = None
        self._argv = [
            python,
            "-m",
            "adapters.whisper.worker",
            "--model",
            model,
            "--device",
            device,
            "--compute-type",
            compute_type,
            "--num-workers",
            str(parallel),
            "--cpu-threads",
            str(cpu_threads),
        ]
        if download_root:
            self._argv += ["--download-root", download_root]
        if allow_download:
            self._argv.append("--allow-download")
        pythonpath = os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
        self._env = {"PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1", **(env or {})}
        if allow_download:
            self._env.pop("HF_HUB_OFFLINE", None)
        self._load_timeout_s = load_timeout_s
        self._log_lines = log_lines
        self.process: EngineProcess | None = None
        self._dir: str | None = None
        self._server: asyncio.AbstractServer | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[str, Transcription] = {}  # until the worker's Done (or a crash)
        self._idle = asyncio.Event()
        self._idle.set()
        self._seq = itertools.count(1)
        self._stopping = False
        self._crash_callbacks: list[Callable[[WhisperEngine], None]] = []

    # -- reading -------------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self.process.state if self.process is not None else EngineState.NEW

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def in_flight(self) -> int:
        """Requests the worker has not answered `Done` to (cancelled ones included)."""
        return len(self._pending)

    async def idle(self) -> None:
        """Return once the worker has finished every request sent to it."""
        await self._idle.wait()

    def logs(self, n: int | None = None) -> list[str]:
        return self.process.logs(n) if self.process is not None else []

    def on_crash(self, callback: Callable[[WhisperEngine], None]) -> None:
        """Call `callback(self)` once if the worker dies without being asked to."""
        self._crash_callbacks.append(callback)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, spawn the worker, and return once it said `Ready`.

        1. Make a private directory and listen on a socket in it.
        2. Spawn the worker through the supervisor (own process group, dies with us).
        3. Ready within the load timeout: return. Otherwise `EngineStartFailed` (from the
           supervisor, with the worker's last log lines) and everything is cleaned up.
        """
        if self.process is not None:
            raise RuntimeError("a WhisperEngine starts once; make a new one to restart")
        self._dir = tempfile.mkdtemp(prefix="quorum-whisper-")  # 1 (mode 0700)
        path = os.path.join(self._dir, "worker.sock")
        self._server = await asyncio.start_unix_server(self._accept, path=path)
        self.process = EngineProcess(  # 2
            name=f"whisper:{self.model_id}",
            logs_of=self.model_id,
            argv=[*self._argv, "--socket", path],
            health=self._health,
            env=self._env,
            inherit=WHISPER_ENVIRONMENT,
            load_timeout_s=self._load_timeout_s,
            log_lines=self._log_lines,
        )
        self.process.on_exit(self._on_exit)
        try:  # 3
            await self.process.start()
        except BaseException:
            await self._close_channel()
            raise
        if self._server is not None:  # the worker is connected: nobody else may
            self._server.close()

    async def stop(self, grace_s: float = 10.0) -> None:
        """Ask the worker to exit, then end its process group; idempotent.

        Transcriptions still in flight fail with `cut` when the runner set it (an unload
        past its drain timeout), else `EngineUnavailable`.
        """
        self._stopping = True
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write(encode(Shutdown()))
        if self.process is not None:
            await self.process.stop(grace_s)
        stopped = EngineUnavailable(f"the speech engine for model {self.model_id!r} stopped")
        self._fail_all(self.cut or stopped)
        await self._close_channel()

    def lost(self, reason: str) -> None:
        """Nothing to do: the engine sees its worker's exit itself (the socket, the
        supervisor) and has already failed its transcriptions, naming the exit."""

    # -- requests ----------------------------------------------------------------------

    def transcribe(
        self,
        audio_path: str,
        *,
        request_id: str,
        task: str = "transcribe",
        language: str | None = None,
        prompt: str | None = None,
        temperature: float | None = None,
        word_timestamps: bool = False,
        traceparent: str | None = None,
    ) -> Transcription:
        """Send the request now; read its answer from the returned `Transcription`.

        The worker knows it as `Transcription.request_id`: `request_id` made unique;
        `traceparent` (the runner's span for it) goes with it, for the worker's log.
        """
        writer = self._writer
        if self.failure is not None:
            raise EngineCrashed(self.failure)
        if writer is None or writer.is_closing() or self.state is not EngineState.READY:
            raise EngineUnavailable(f"the speech engine for model {self.model_id!r} is not ready")
        request_id = f"{next(self._seq)}:{request_id}"  # clients may reuse X-Request-Id
        transcription = Transcription(self, request_id)
        self._pending[request_id] = transcription
        self._idle.clear()
        message = Transcribe(
            request_id,
            audio_path,
            task,
            language,
            prompt,
            temperature,
            word_timestamps,
            traceparent,
        )
        writer.write(encode(message))
        return transcription

    def cancel(self, request_id: str) -> None:
        """Ask the worker to stop `request_id` at its next segment (no-op when unknown)."""
        writer = self._writer
        if request_id in self._pending and writer is not None and not writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(encode(Cancel(request_id)))

    @property
    def closed(self) -> bool:
        """Crashed or stopping: no more answers will come from the worker."""
        return self.failure is not None or self._stopping

    async def silent(self, request_id: str) -> EngineError:
        """`request_id` heard nothing for `silence_s`: kill the stuck worker (a crash, see
        the module docstring) and wait until its exit was heard, so the model is known
        failed before the request's slot frees; the request's error (504)."""
        waited = f"{self.silence_s:g} s"
        process = self.process
        if process is not None:
            process.kill(f"stuck: nothing sent on a transcription for {waited}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(process.wait_exit()), _EXIT_WAIT_S)
        return EngineSilent(
            f"the speech engine for model {self.model_id!r} sent nothing on this "
            f"transcription for {waited} (ENGINE_READ_TIMEOUT_S); its worker was killed"
        )

    def forget(self, request_id: str) -> None:
        """`request_id` is answered (or will never be): its slot is free."""
        self._pending.pop(request_id, None)
        if not self._pending:
            self._idle.set()

    # -- the channel -----------------------------------------------------------------

    async def _health(self) -> bool:
        return self.ready is not None and self._writer is not None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._writer is not None:  # one worker, one connection
            writer.close()
            return
        self._writer = writer
        self._reader_task = asyncio.current_task()
        reason = "the worker closed its connection"
        try:
            while True:
                header = await reader.readexactly(HEADER_SIZE)
                payload = await reader.readexactly(frame_length(header))
                self._dispatch(decode(payload))
        except asyncio.IncompleteReadError:
            pass
        except (OSError, ProtocolError) as exc:
            reason = f"the worker's channel broke: {exc}"
            if isinstance(exc, ProtocolError):
                self._fail_all(EngineBadResponse(f"speech worker sent a bad frame: {exc}"))
        except asyncio.CancelledError:
            return
        await self._lost(reason)

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Ready):
            self.ready = message
            return
        if isinstance(message, Info | Segment | Done):
            transcription = self._pending.get(message.request_id)
            if transcription is not None:
                transcription.deliver(message)
            return
        raise ProtocolError(f"a worker does not send {type(message).__name__}")

    async def _lost(self, reason: str) -> None:
        """The channel ended: a crash unless we asked for it. Fail everyone with the cause."""
        if self._stopping or self.process is None:
            return
        exit_info = None
        with contextlib.suppress(TimeoutError):
            exit_info = await asyncio.wait_for(self.process.wait_exit(), _EXIT_WAIT_S)
        if self._stopping:
            return
        how = exit_info.describe() if exit_info is not None else reason
        self._crashed(how)

    def _on_exit(self, process: EngineProcess) -> None:
        if self._stopping or process.exit is None or process.exit.expected:
            return
        self._crashed(process.exit.describe())

    def _crashed(self, how: str) -> None:
        if self.failure is not None:
            return
        self.failure = f"the speech engine for model {self.model_id!r} crashed ({how})"
        log.error("%s; %d transcriptions in flight fail", self.failure, len(self._pending))
        self._fail_all(EngineCrashed(self.failure))
        for callback in self._crash_callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("whisper %s: crash callback failed", self.model_id)

    def _fail_all(self, error: BaseException) -> None:
        for transcription in list(self._pending.values()):
            transcription.deliver(error)

    async def _close_channel(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._writer is not None:
            self._writer.close()
        task = self._reader_task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
