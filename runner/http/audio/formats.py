"""The OpenAI audio API's response formats, rendered from segments (pure).

| response_format | body                                                   | content type |
|-----------------|--------------------------------------------------------|--------------|
| json (default)  | `{"text": ...}`                                        | JSON         |
| text            | the text and a newline                                 | text/plain   |
| srt             | SubRip cues, `00:00:01,000 --> 00:00:02,500`           | text/plain   |
| vtt             | `WEBVTT`, then cues `00:00:01.000 --> 00:00:02.500`    | text/vtt     |
| verbose_json    | task, language (its name), duration, text, segments    | JSON         |
|                 | (ids from 0), and `words` when `word` was asked for    |              |

Streaming (`stream=true`): one `transcript.text.delta` SSE event per segment, then
`transcript.text.done` with the full text; the deltas concatenate to that text (up to
whitespace at its ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from adapters.speech import Segment
from runner.http.audio.languages import language_name

RESPONSE_FORMATS = frozenset({"json", "text", "srt", "verbose_json", "vtt"})
JSON = b"application/json"
TEXT = b"text/plain; charset=utf-8"
VTT = b"text/vtt; charset=utf-8"
SSE = b"text/event-stream"


@dataclass(frozen=True, slots=True)
class Transcript:
    """A finished transcription, as the renderers need it."""

    task: str  # "transcribe" | "translate"
    language: str  # ISO code, as the engine reports it
    duration: float  # seconds of audio
    segments: tuple[Segment, ...]


def full_text(segments: Sequence[Segment]) -> str:
    return "".join(s.text for s in segments).strip()


def render(
    transcript: Transcript, response_format: str, words: bool = False
) -> tuple[bytes, bytes]:
    """The body and content type of `transcript` in `response_format`."""
    if response_format == "text":
        return (full_text(transcript.segments) + "\n").encode(), TEXT
    if response_format == "srt":
        return render_srt(transcript.segments).encode(), TEXT
    if response_format == "vtt":
        return render_vtt(transcript.segments).encode(), VTT
    if response_format == "verbose_json":
        return orjson.dumps(verbose_json(transcript, words)), JSON
    return orjson.dumps({"text": full_text(transcript.segments)}), JSON


def verbose_json(transcript: Transcript, words: bool = False) -> dict[str, object]:
    out: dict[str, object] = {
        "task": transcript.task,
        "language": language_name(transcript.language),
        "duration": round(transcript.duration, 3),
        "text": full_text(transcript.segments),
        "segments": [
            {
                "id": i,
                "seek": s.seek,
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": list(s.tokens),
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for i, s in enumerate(transcript.segments)
        ],
    }
    if words:
        out["words"] = [
            {"word": w.word.strip(), "start": w.start, "end": w.end}
            for s in transcript.segments
            for w in s.words or ()
        ]
    return out


def timestamp(seconds: float, decimal: str) -> str:
    """`HH:MM:SS<decimal>mmm`, rounded to the millisecond."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def render_srt(segments: Sequence[Segment]) -> str:
    """Numbered cues from 1, each ended by a blank line."""
    return "".join(
        f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text.strip()}\n\n"
        for i, s in enumerate(segments, start=1)
    )


def render_vtt(segments: Sequence[Segment]) -> str:
    """The WEBVTT header, then cues, each ended by a blank line."""
    return "WEBVTT\n\n" + "".join(
        f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text.strip()}\n\n"
        for s in segments
    )


def delta_text(segment: Segment, first: bool) -> str:
    """A segment's delta: the first loses its leading space, so deltas join to the text."""
    return segment.text.lstrip() if first else segment.text


def sse_delta(delta: str) -> bytes:
    return b"data: " + orjson.dumps({"type": "transcript.text.delta", "delta": delta}) + b"\n\n"


def sse_done(text: str) -> bytes:
    return b"data: " + orjson.dumps({"type": "transcript.text.done", "text": text}) + b"\n\n"


def sse_error(error_body: bytes) -> bytes:
    """An error after the stream began: the runner's error envelope as the last event."""
    return b"data: " + error_body + b"\n\n"
