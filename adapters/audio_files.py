"""How an uploaded audio file is opened: the one decision the runner's probe
(runner/http/audio/probe.py) and the speech worker (adapters/whisper/worker.py) share.

The container is the one its first bytes name (`detect_container`), forced, with the same
options (`OPEN_OPTIONS`: files only, a bounded probe), never left to FFmpeg to guess: a
file can start as one container and hold another that FFmpeg's own sniffing prefers
(three MP3 frames before ten seconds of MPEG-TS: the probe measured 0.13 s, an
autodetecting decoder transcribed the ten seconds), and FFmpeg's playlist and list
demuxers (HLS, `ffconcat`) open other files or URLs the upload names. So the worker
decodes exactly what the probe measured, and what it admitted the request for.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from adapters.errors import InvalidAudio

if TYPE_CHECKING:
    import av.container
    import numpy as np
    import numpy.typing as npt

OPEN_TIMEOUT_S = 15.0
"""At most this long opening, reading and measuring one upload (FFmpeg's own interrupt)."""
OPEN_OPTIONS = {"protocol_whitelist": "file", "probesize": "5000000"}
"""FFmpeg's options for an upload: it may read files only, and probes at most 5 MB."""
KNOWN = "wav, flac, ogg, mp3, aac, mp4/m4a, webm, mpeg, aiff, caf, wma, amr, au"


def detect_container(head: bytes) -> str | None:
    """The FFmpeg demuxer for a file starting with `head` (its first 16 bytes or more), by
    the container's magic bytes; None when it is none of the audio containers known here."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:3] == b"ID3":
        return "mp3"
    if head[4:8] == b"ftyp":
        return "mp4"
    if head[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if head[:4] == b"\x00\x00\x01\xba":
        return "mpeg"
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "aiff"
    if head[:4] == b"caff":
        return "caf"
    if head[:8] == b"\x30\x26\xb2\x75\x8e\x66\xcf\x11":
        return "asf"
    if head[:5] == b"#!AMR":
        return "amr"
    if head[:4] == b".snd":
        return "au"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:  # ADTS sync, layer 0
        return "aac"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # MPEG audio frame
        return "mp3"
    return None


def open_audio(path: str) -> av.container.InputContainer:
    """`path` opened as the container its content names, with OPEN_OPTIONS.

    1. Read its first 16 bytes (unreadable: `InvalidAudio`).
    2. The container they name (`detect_container`; none: `InvalidAudio` listing KNOWN).
    3. Open it forced to that container, files only, within OPEN_TIMEOUT_S; FFmpeg's
       refusal: `InvalidAudio` naming its complaint.
    """
    import av
    import av.error

    try:  # 1
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as exc:
        raise InvalidAudio(f"Invalid file format: the file could not be read ({exc})") from None
    kind = detect_container(head)  # 2
    if kind is None:
        raise InvalidAudio(
            f"Invalid file format: not an audio container this runner reads ({KNOWN})"
        )
    try:  # 3
        return av.open(
            path,
            format=kind,
            options=OPEN_OPTIONS,
            metadata_errors="ignore",
            timeout=OPEN_TIMEOUT_S,
        )
    except (av.error.FFmpegError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidAudio(
            f"Invalid file format: the file could not be read as audio ({ffmpeg_reason(exc)})"
        ) from None


def decode_upload(path: str, sampling_rate: int) -> npt.NDArray[np.float32]:
    """The first audio stream of `path` (opened by `open_audio`), mono float32 at
    `sampling_rate`, as faster-whisper's `decode_audio` makes it: packets the decoder
    refuses are skipped; a file with no audio stream is `InvalidAudio`."""
    import av.audio.resampler
    import av.error
    import numpy as np

    resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=sampling_rate)
    raw = io.BytesIO()
    with open_audio(path) as container:
        if not container.streams.audio:
            raise InvalidAudio("Invalid file format: the file has no audio stream")
        stream = container.streams.audio[0]
        try:
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.FFmpegError:
                    continue  # as faster-whisper: a bad packet is skipped
                for frame in frames:
                    frame.pts = None  # the resampler keeps its own time
                    for out in resampler.resample(frame):
                        raw.write(out.to_ndarray().tobytes())
        except av.error.FFmpegError:
            pass  # a demuxer error ends the stream, as in the probe
        for out in resampler.resample(None):
            raw.write(out.to_ndarray().tobytes())
    audio = np.frombuffer(raw.getbuffer(), dtype=np.int16)
    return audio.astype(np.float32) / 32768.0


def ffmpeg_reason(exc: BaseException) -> str:
    """FFmpeg's words for the failure, without the errno and the C function name."""
    strerror = getattr(exc, "strerror", None)
    return str(strerror) if strerror else str(exc)
