"""probe_audio on real files: espeak-ng speech, sox silence, corrupt and non-audio files."""

from __future__ import annotations

import struct
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from adapters.errors import InvalidAudio
from runner.http.audio.errors import AudioTooShort
from runner.http.audio.probe import probe_audio
from tests.adapters.whisper.speech import SpeechFiles


def test_probe_measures_speech(speech: SpeechFiles) -> None:
    """A WAV of espeak-ng speech decodes; its duration is sox's."""
    info = probe_audio(str(speech.hello))
    expected = float(
        subprocess.run(
            ["sox", "--i", "-D", str(speech.hello)], capture_output=True, text=True
        ).stdout
    )
    assert info.duration_s == pytest.approx(expected, abs=0.01)
    assert info.container == "wav" and info.sample_rate > 0


def test_probe_long_file_uses_its_metadata(speech: SpeechFiles, tmp_path: Path) -> None:
    """A file longer than the check window is measured too (ogg: from the stream)."""
    ogg = tmp_path / "long.ogg"
    subprocess.run(["sox", str(speech.long), str(ogg)], check=True)
    info = probe_audio(str(ogg), check_seconds=0.5)
    assert info.codec == "vorbis" and 50 < info.duration_s < 80


def test_probe_too_short_is_audio_too_short(speech: SpeechFiles) -> None:
    """0.05 s of audio: 400 audio_too_short."""
    with pytest.raises(AudioTooShort) as caught:
        probe_audio(str(speech.short))
    assert caught.value.status == 400 and caught.value.code == "audio_too_short"


def test_probe_mp3_header_on_random_bytes_is_invalid_audio(speech: SpeechFiles) -> None:
    """An ID3 header on random bytes: 400 invalid_audio saying it could not be decoded."""
    with pytest.raises(InvalidAudio) as caught:
        probe_audio(str(speech.bad_mp3))
    assert caught.value.status == 400 and "could not be decoded" in str(caught.value)


def test_probe_text_file_is_invalid_audio(tmp_path: Path) -> None:
    """A file that is no media at all: 400 invalid_audio."""
    path = tmp_path / "notes.txt"
    path.write_text("just some words\n" * 100)
    with pytest.raises(InvalidAudio):
        probe_audio(str(path))


def _matroska(path: Path, seconds: int, declared_ms: float) -> Path:
    """`seconds` of a 440 Hz tone in Matroska (PCM), its header's `Duration` rewritten to
    `declared_ms` (the client's claim: nothing checks it against the blocks)."""
    rate, step = 16000, 1600
    tone = (np.sin(2 * np.pi * 440 * np.arange(rate * seconds) / rate) * 8000).astype(np.int16)
    with av.open(str(path), "w", format="matroska") as out:
        stream = out.add_stream("pcm_s16le", rate=rate, layout="mono")
        for i in range(0, len(tone), step):
            frame = av.AudioFrame.from_ndarray(
                tone[None, i : i + step], format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts, frame.time_base = rate, i, Fraction(1, rate)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    data = bytearray(path.read_bytes())
    at = data.find(b"\x44\x89\x88")  # Duration, an 8-byte float (ms)
    assert at > 0
    data[at + 3 : at + 11] = struct.pack(">d", declared_ms)
    path.write_bytes(bytes(data))
    return path


def test_probe_measures_the_audio_not_the_headers_claim(tmp_path: Path) -> None:
    """20 s of audio whose Matroska header declares 1.5 s is measured 20 s (the packets),
    as the worker transcribes and charges it; the header's claim is never the cost."""
    info = probe_audio(str(_matroska(tmp_path / "claims.mka", 20, 1500.0)))
    assert info.container == "matroska"
    assert info.duration_s == pytest.approx(20.0, abs=0.05)
