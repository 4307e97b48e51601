"""The speech worker: one process per Whisper model, driven over a Unix socket.

    python -m adapters.whisper.worker --socket PATH --model PATH_OR_SIZE \
        [--device cpu] [--compute-type int8] [--num-workers N] [--cpu-threads T]

1. Connect to the runner's socket (so a failed load is reported on the log, not lost).
2. Load `WhisperModel`; send `Ready(model, load_ms)`.
3. Serve: each `Transcribe` runs on one of `num_workers` threads (CTranslate2's
   `num_workers` makes their `generate` calls truly parallel; more requests wait in
   the pool's queue). Segments are iterated lazily and each is sent as it is produced;
   a `Cancel` for the request stops the iteration at the next segment.
4. The upload is decoded as the runner's probe opened it: the container its first bytes
   name, forced, files only (adapters/audio_files.py), never FFmpeg's guess.
   Every request ends with exactly one `Done`; a bad file is `Done(error=...)`, never
   the end of the worker.
5. `Shutdown`, or the runner closing the socket, ends the process at once (`os._exit`:
   a thread inside CTranslate2 cannot be interrupted, and memory returns only when the
   process ends anyway).

Logs go to stderr, which the supervisor keeps in its ring.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from adapters.audio_files import decode_upload
from adapters.errors import InvalidAudio
from adapters.speech import Info, Segment, Word
from adapters.whisper.messages import (
    Cancel,
    Done,
    Message,
    ProtocolError,
    Ready,
    Shutdown,
    Transcribe,
    recv_blocking,
    send_blocking,
)

log = logging.getLogger("quorum.whisper.worker")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="adapters.whisper.worker")
    p.add_argument("--socket", required=True, help="Unix socket the runner listens on")
    p.add_argument("--model", required=True, help="CTranslate2 model directory or size name")
    p.add_argument("--device", default="cpu")
    p.add_argument("--compute-type", default="int8")
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--cpu-threads", type=int, default=0)
    p.add_argument("--download-root", default=None)
    p.add_argument("--allow-download", action="store_true", help="fetch sizes from the Hub")
    return p.parse_args(argv)


class Worker:
    """Serves transcriptions for one loaded model over one connected socket."""

    def __init__(self, sock: socket.socket, model: Any, num_workers: int) -> None:
        self.sock = sock
        self.model = model
        self._send_lock = threading.Lock()
        self._cancelled: dict[str, threading.Event] = {}
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="whisper")
        multilingual = bool(model.model.is_multilingual)
        self.languages = frozenset(model.supported_languages) if multilingual else None

    def send(self, message: Message) -> None:
        with self._send_lock:
            send_blocking(self.sock, message)

    def serve(self) -> None:
        """Step 3-5: read messages until Shutdown or EOF."""
        while True:
            try:
                message = recv_blocking(self.sock)
            except (OSError, ProtocolError) as exc:
                log.error("runner channel broke: %s", exc)
                return
            if message is None or isinstance(message, Shutdown):
                return
            if isinstance(message, Transcribe):
                if message.request_id in self._cancelled:
                    log.error("duplicate request id %s ignored", message.request_id)
                    continue
                self._cancelled[message.request_id] = threading.Event()
                self._pool.submit(self._run, message)
            elif isinstance(message, Cancel):
                event = self._cancelled.get(message.request_id)
                if event is not None:
                    event.set()
            else:
                log.error("unexpected message %s ignored", type(message).__name__)

    def _run(self, req: Transcribe) -> None:
        """One request; whatever happens, one Done is sent. A traced one (`traceparent`)
        is logged with its trace id, so its lines join the runner's trace."""
        started = time.perf_counter()
        if req.traceparent:
            parts = req.traceparent.split("-")
            trace_id = parts[1] if len(parts) == 4 else "?"
            log.info("request %s started trace_id=%s", req.request_id, trace_id)
        cancel = self._cancelled[req.request_id]
        error: str | None = None
        code: str | None = None
        try:
            code, error = self._transcribe(req, cancel)
        except Exception as exc:  # CTranslate2 / numpy failures: data, not death
            log.exception("request %s failed", req.request_id)
            # The exception's words (paths, the audio's content) stay in the log (admins).
            code, error = "engine_error", f"transcription failed ({type(exc).__name__})"
        finally:
            self._cancelled.pop(req.request_id, None)
        engine_ms = int((time.perf_counter() - started) * 1000)
        with contextlib.suppress(OSError):  # the runner is gone: serve() sees EOF, we exit
            self.send(Done(req.request_id, error, engine_ms, code))

    def _transcribe(
        self, req: Transcribe, cancel: threading.Event
    ) -> tuple[str | None, str | None]:
        if self.languages is not None and req.language and req.language not in self.languages:
            return "unsupported_language", f"language {req.language!r} is not supported"
        sampling_rate = self.model.feature_extractor.sampling_rate
        try:
            audio = decode_upload(req.audio_path, sampling_rate)  # as the probe opened it
        except InvalidAudio as exc:
            return "invalid_audio", str(exc)
        except Exception as exc:
            return "invalid_audio", f"the audio file could not be decoded: {exc}"
        if audio.shape[0] == 0:  # faster-whisper skips undecodable frames: maybe all
            return "invalid_audio", "the file contains no decodable audio"
        if cancel.is_set():
            return "cancelled", "cancelled"
        temperature: Any = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        if req.temperature:
            temperature = req.temperature
        segments, info = self.model.transcribe(
            audio,
            task=req.task,
            language=req.language,
            initial_prompt=req.prompt or None,
            temperature=temperature,
            word_timestamps=req.word_timestamps,
        )
        self.send(Info(req.request_id, float(info.duration), str(info.language)))
        sent = 0
        for seg in segments:  # lazy: each step decodes one more window
            if cancel.is_set():
                break
            self.send(_segment(req.request_id, seg))
            sent += 1
        if cancel.is_set():
            log.info("request %s cancelled after %d segments", req.request_id, sent)
            return "cancelled", "cancelled"
        return None, None

    def close(self) -> None:
        for event in list(self._cancelled.values()):
            event.set()


def _segment(request_id: str, seg: Any) -> Segment:
    words = None
    if seg.words is not None:
        words = tuple(
            Word(str(w.word), float(w.start), float(w.end), float(w.probability)) for w in seg.words
        )
    return Segment(
        request_id=request_id,
        id=int(seg.id),
        seek=int(seg.seek),
        start=float(seg.start),
        end=float(seg.end),
        text=str(seg.text),
        tokens=tuple(int(t) for t in seg.tokens),
        temperature=float(seg.temperature or 0.0),
        avg_logprob=float(seg.avg_logprob),
        compression_ratio=float(seg.compression_ratio),
        no_speech_prob=float(seg.no_speech_prob),
        words=words,
    )


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    # 1
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(args.socket)
    # 2
    started = time.perf_counter()
    from faster_whisper import WhisperModel

    model = WhisperModel(
        args.model,
        device=args.device,
        compute_type=args.compute_type,
        cpu_threads=args.cpu_threads,
        num_workers=args.num_workers,
        download_root=args.download_root,
        local_files_only=not args.allow_download,
    )
    load_ms = int((time.perf_counter() - started) * 1000)
    worker = Worker(sock, model, args.num_workers)
    worker.send(Ready(args.model, load_ms))
    log.info("model %s loaded in %d ms; %d parallel", args.model, load_ms, args.num_workers)
    # 3, 4
    worker.serve()
    # 5
    worker.close()
    log.info("worker exiting")
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
