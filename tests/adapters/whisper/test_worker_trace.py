"""The runner's trace context reaches the speech worker in its job message, and the
worker's log names the trace (a stand-in model in the worker's own process)."""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from types import SimpleNamespace

import pytest

from adapters.whisper import messages as m
from adapters.whisper.worker import Worker


def _model() -> SimpleNamespace:
    """What the worker reads of a WhisperModel before it decodes (English only)."""
    return SimpleNamespace(
        model=SimpleNamespace(is_multilingual=False),
        supported_languages=["en"],
        feature_extractor=SimpleNamespace(sampling_rate=16000),
    )


def test_transcribe_message_carries_the_traceparent() -> None:
    """`traceparent` survives the wire format; a message without one reads as None."""
    parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    message = m.Transcribe("r1", "/tmp/a.wav", traceparent=parent)
    frame = m.encode(message)
    assert m.decode(frame[m.HEADER_SIZE :]) == message
    assert m.decode(b'{"type": "Transcribe", "request_id": "r", "audio_path": "p"}') == (
        m.Transcribe("r", "p")
    )


def test_worker_logs_the_requests_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    """A traced request: the worker's log line about it carries `trace_id=` (the runner's
    trace), and it still ends with one `Done`; an untraced one logs no trace id."""
    trace_id = secrets.token_hex(16)
    runner, worker_end = socket.socketpair()
    worker = Worker(worker_end, _model(), num_workers=1)
    serving = threading.Thread(target=worker.serve, daemon=True)
    caplog.set_level(logging.INFO, logger="quorum.whisper.worker")
    with runner, worker_end:
        serving.start()
        traced = m.Transcribe("r1", "/nonexistent.wav", traceparent=f"00-{trace_id}-{'1' * 16}-01")
        m.send_blocking(runner, traced)
        runner.settimeout(30)
        done = m.recv_blocking(runner)
        assert isinstance(done, m.Done) and done.request_id == "r1"
        assert done.error_code == "invalid_audio"
        m.send_blocking(runner, m.Transcribe("r2", "/nonexistent.wav"))
        assert isinstance(m.recv_blocking(runner), m.Done)
        m.send_blocking(runner, m.Shutdown())
        serving.join(10)
    lines = [r.getMessage() for r in caplog.records if r.name == "quorum.whisper.worker"]
    assert f"request r1 started trace_id={trace_id}" in lines, lines
    assert not any("r2" in line and "trace_id" in line for line in lines), lines
