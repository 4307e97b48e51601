"""The last doors of issue 38: a share of connections kept for authenticated clients, the
speech worker decoding what the probe measured, and a Host allow-list. One test per
attack; each failed on `f34d4e0`."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.whisper.messages import Done, Shutdown, Transcribe, recv_blocking, send_blocking
from adapters.whisper.worker import Worker
from runner.audio.probe import probe_audio

pytestmark = pytest.mark.timeout(120)


# -- the speech worker decodes what the probe measured -----------------------------------


class _RecordingModel:
    """A stand-in WhisperModel that records the audio it was asked to transcribe."""

    class model:  # noqa: N801 - faster-whisper's attribute names
        is_multilingual = False

    class feature_extractor:  # noqa: N801
        sampling_rate = 16_000

    supported_languages = ("en",)

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def transcribe(self, audio: Any, **_: Any) -> tuple[list[Any], Any]:
        self.seconds.append(len(audio) / self.feature_extractor.sampling_rate)

        class Info:
            duration = self.seconds[-1]
            language = "en"

        return [], Info()


def _encode(container: str, codec: str, seconds: float, options: dict[str, str]) -> bytes:
    """`seconds` of a 440 Hz tone at 16 kHz, encoded by PyAV."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format=container, options=options) as out:
        stream = out.add_stream(codec, rate=16_000)
        t = np.arange(int(seconds * 16_000)) / 16_000
        tone = (np.sin(2 * np.pi * 440 * t) * 0.3).astype(np.float32)
        for i in range(0, len(tone), 1024):
            frame = av.AudioFrame.from_ndarray(tone[None, i : i + 1024], "flt", "mono")
            frame.sample_rate = 16_000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def _mp3_frames_then_ts(path: Path) -> None:
    """Four MP3 frames (no ID3 tag: the first bytes are an MPEG audio sync), then ten
    seconds of MPEG-TS with AAC: the content says mp3, FFmpeg's sniffing says mpegts."""
    import av

    mp3 = _encode("mp3", "libmp3lame", 1.0, {"id3v2_version": "0", "write_xing": "0"})
    with av.open(io.BytesIO(mp3), format="mp3") as container:
        starts = [p.pos for p in container.demux() if p.size]
    ts = _encode("mpegts", "aac", 10.0, {})
    path.write_bytes(mp3[: starts[4]] + ts)


@pytest.fixture
def worker_channel() -> Iterator[tuple[socket.socket, _RecordingModel]]:
    """A speech worker serving a recording model over a socket pair."""
    ours, theirs = socket.socketpair()
    ours.settimeout(60)
    model = _RecordingModel()
    worker = Worker(theirs, model, num_workers=1)
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        yield ours, model
    finally:
        send_blocking(ours, Shutdown())
        thread.join(timeout=30)
        ours.close()
        theirs.close()


def test_worker_decodes_the_container_the_probe_measured(
    tmp_path: Path, worker_channel: tuple[socket.socket, _RecordingModel]
) -> None:
    """Attack: an upload starting with a few MP3 frames and then ten seconds of MPEG-TS:
    the probe (forced to mp3) measured 0.17 s, the request was admitted at that cost, and
    the worker (FFmpeg guessing again) transcribed the ten seconds. The worker decodes with
    the probe's container and options: what it transcribes is what was measured."""
    upload = tmp_path / "quorum-audio-upload"
    _mp3_frames_then_ts(upload)
    measured = probe_audio(str(upload)).duration_s
    assert measured < 1.0
    sock, model = worker_channel
    send_blocking(sock, Transcribe("r1", str(upload)))
    while not isinstance(message := recv_blocking(sock), Done):
        assert message is not None, "the worker closed the channel"
    assert message.error is None, message
    assert model.seconds and model.seconds[0] <= measured + 0.1, (model.seconds, measured)
