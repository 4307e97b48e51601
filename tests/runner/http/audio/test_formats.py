"""The OpenAI response formats rendered from segments (pure)."""

from __future__ import annotations

import orjson

from adapters.speech import Segment, Word
from runner.http.audio import formats as f

SEGMENTS = (
    Segment(
        "r", 1, 0, 0.0, 2.16, " Hello world.", (50363, 18435), 0.0, -0.62, 0.83, 0.04,
        (Word(" Hello", 0.0, 0.38, 0.7), Word(" world.", 0.38, 0.98, 0.3)),
    ),
    Segment("r", 2, 300, 3661.5, 3663.0004, " One two.", (530,), 0.2, -0.5, 1.0, 0.1, None),
)  # fmt: skip
T = f.Transcript("transcribe", "en", 3663.25, SEGMENTS)


def test_formats_json_is_the_text() -> None:
    """json is {"text": ...}: the segments joined, without surrounding spaces."""
    body, ctype = f.render(T, "json")
    assert orjson.loads(body) == {"text": "Hello world. One two."}
    assert ctype == f.JSON


def test_formats_text_is_plain_text_and_a_newline() -> None:
    """text is the text itself and a newline, as text/plain."""
    assert f.render(T, "text") == (b"Hello world. One two.\n", f.TEXT)


def test_formats_srt_numbers_cues_with_comma_milliseconds() -> None:
    """srt: numbered cues from 1, HH:MM:SS,mmm, blank lines between."""
    body, _ = f.render(T, "srt")
    assert body.decode() == (
        "1\n00:00:00,000 --> 00:00:02,160\nHello world.\n\n"
        "2\n01:01:01,500 --> 01:01:03,000\nOne two.\n\n"
    )


def test_formats_vtt_has_header_and_dot_milliseconds() -> None:
    """vtt: WEBVTT, then cues with HH:MM:SS.mmm."""
    body, ctype = f.render(T, "vtt")
    assert body.decode() == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:02.160\nHello world.\n\n"
        "01:01:01.500 --> 01:01:03.000\nOne two.\n\n"
    )
    assert ctype == f.VTT


def test_formats_verbose_json_has_openai_fields() -> None:
    """verbose_json: task, language name, duration, text, segments from id 0; no words."""
    out = orjson.loads(f.render(T, "verbose_json")[0])
    assert out["task"] == "transcribe" and out["language"] == "english"
    assert out["duration"] == 3663.25 and out["text"] == "Hello world. One two."
    assert "words" not in out
    first = out["segments"][0]
    assert first == {
        "id": 0, "seek": 0, "start": 0.0, "end": 2.16, "text": " Hello world.",
        "tokens": [50363, 18435], "temperature": 0.0, "avg_logprob": -0.62,
        "compression_ratio": 0.83, "no_speech_prob": 0.04,
    }  # fmt: skip
    assert [s["id"] for s in out["segments"]] == [0, 1]


def test_formats_verbose_json_words_when_asked() -> None:
    """With word granularity, words are listed with start and end, spaces trimmed."""
    out = f.verbose_json(T, words=True)
    assert out["words"] == [
        {"word": "Hello", "start": 0.0, "end": 0.38},
        {"word": "world.", "start": 0.38, "end": 0.98},
    ]


def test_formats_empty_transcript_renders_empty() -> None:
    """No segments (silence): empty text, an srt with no cues, a vtt with only its header."""
    empty = f.Transcript("translate", "xx", 1.0, ())
    assert orjson.loads(f.render(empty, "json")[0]) == {"text": ""}
    assert f.render(empty, "srt")[0] == b""
    assert f.render(empty, "vtt")[0] == b"WEBVTT\n\n"
    assert f.verbose_json(empty)["language"] == "xx"


def test_formats_sse_deltas_join_to_the_done_text() -> None:
    """Stream events: a delta per segment (the first without its leading space), then done."""
    deltas = [f.delta_text(s, i == 0) for i, s in enumerate(SEGMENTS)]
    assert "".join(deltas) == f.full_text(SEGMENTS)
    event = f.sse_delta(deltas[0])
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:]) == {"type": "transcript.text.delta", "delta": "Hello world."}
    done = orjson.loads(f.sse_done("Hello world. One two.")[6:])
    assert done == {"type": "transcript.text.done", "text": "Hello world. One two."}


def test_formats_timestamp_rounds_to_the_millisecond() -> None:
    """Timestamps round to whole milliseconds and never go negative."""
    assert f.timestamp(59.9996, ".") == "00:01:00.000"
    assert f.timestamp(-0.01, ",") == "00:00:00,000"
