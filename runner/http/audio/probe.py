"""Is this file audio we can transcribe, and how long is it? (PyAV, before admission.)

The duration is the request's cost in the scheduler and the total of a job's
progress, so it must be known before the request queues; a file the worker
could not decode must be refused with a 400 here, not after a wait in the queue.
It is measured from the audio itself (decoded samples, then the packets' timestamps),
never read from the file's header: the header is the client's claim (a Matroska
`Duration` or an MP3 Xing frame count can say 1.5 s over an hour of audio, which the
worker then transcribes whole).

`probe_audio` blocks (it decodes); call it in a thread: `await asyncio.to_thread(...)`.

An upload is opened as the container its first bytes say it is, forced, with FFmpeg
reading files only, within OPEN_TIMEOUT_S (`adapters/audio_files.open_audio`, the
very decision the speech worker decodes with): never guessed by FFmpeg from its name or by
probing every demuxer. Anything else is `invalid_audio`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import av
import av.error

from adapters.audio_files import ffmpeg_reason, open_audio
from adapters.errors import InvalidAudio
from runner.http.audio.errors import AudioTooShort

MIN_DURATION_S = 0.1
CHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class AudioInfo:
    duration_s: float
    container: str
    codec: str
    sample_rate: int
    channels: int


def probe_audio(path: str, check_seconds: float = CHECK_SECONDS) -> AudioInfo:
    """Check that `path` holds decodable audio and measure its duration.

    1. Open the container its content names (`containers.open_audio`: `InvalidAudio`
       when it names none, or naming FFmpeg's complaint).
    2. No audio stream: `InvalidAudio`.
    3. Decode the first audio stream packet by packet, skipping packets that fail (as
       faster-whisper does), until `check_seconds` of samples were decoded or it ends.
    4. Nothing decoded: `InvalidAudio` with the first decoder error.
    5. Duration: the decoded samples if the stream ended within the check (exact);
       else the end of the last packet demuxed (its timestamp plus its duration, from
       the first packet's: no decoding), else (no timestamps) decode to the end.
       Never the header's declared duration.
    6. Under 0.1 s: `AudioTooShort` (OpenAI's code and message).
    """
    container = open_audio(path)  # 1
    with container:
        if not container.streams.audio:  # 2
            raise InvalidAudio("Invalid file format: the file has no audio stream")
        stream = container.streams.audio[0]
        rate = int(stream.rate or stream.codec_context.sample_rate or 0)
        samples = 0
        start: int | None = None  # the first packet's timestamp
        first_error: BaseException | None = None
        ended = True
        packets = container.demux(stream)
        try:  # 3
            for packet in packets:
                if start is None and packet.pts is not None:
                    start = packet.pts
                try:
                    frames = packet.decode()
                except av.error.FFmpegError as exc:
                    first_error = first_error or exc
                    continue
                for frame in frames:
                    samples += frame.samples
                    rate = rate or int(frame.sample_rate)
                if rate and samples >= check_seconds * rate:
                    ended = False
                    break
        except av.error.FFmpegError as exc:  # a demuxer error ends the stream
            first_error = first_error or exc
        if samples == 0 or not rate:  # 4
            why = f" ({ffmpeg_reason(first_error)})" if first_error is not None else ""
            raise InvalidAudio(f"Invalid file format: the audio could not be decoded{why}")
        duration = samples / rate  # 5
        if not ended:
            duration = _demuxed_end(packets, stream, start) or _decode_rest(packets, samples, rate)
        info = AudioInfo(
            duration_s=duration,
            container=str(container.format.name),
            codec=str(stream.codec_context.name),
            sample_rate=rate,
            channels=int(stream.codec_context.channels or 0),
        )
    if info.duration_s < MIN_DURATION_S:  # 6
        raise AudioTooShort("Audio file is too short. Minimum audio length is 0.1 seconds.")
    return info


def _demuxed_end(
    packets: Iterator[av.Packet[av.AudioStream]], stream: av.AudioStream, start: int | None
) -> float:
    """Seconds from the first packet's timestamp `start` to the end of the last packet
    demuxed from `packets` (read, not decoded); 0.0 when they carry no timestamps."""
    if start is None or stream.time_base is None:
        return 0.0
    end = start
    try:
        for packet in packets:
            if packet.pts is not None:
                end = max(end, packet.pts + (packet.duration or 0))
    except av.error.FFmpegError:  # a demuxer error ends the stream
        pass
    return float((end - start) * Fraction(stream.time_base))


def _decode_rest(packets: object, samples: int, rate: int) -> float:
    """Keep decoding (skipping bad packets) and count every sample."""
    try:
        for packet in packets:  # type: ignore[attr-defined]
            try:
                frames = packet.decode()
            except av.error.FFmpegError:
                continue
            samples += sum(frame.samples for frame in frames)
    except av.error.FFmpegError:
        pass
    return samples / rate
