"""Form fields validated into a SpeechRequest (pure)."""

from __future__ import annotations

import pytest

from adapters.errors import UnsupportedLanguage
from runner.http.audio.errors import InvalidForm
from runner.http.audio.multipart import AudioUpload
from runner.http.audio.request import parse_request


def _upload(**fields: str | list[str]) -> AudioUpload:
    plain = {k: v for k, v in fields.items() if isinstance(v, str)}
    lists = {k: v for k, v in fields.items() if isinstance(v, list)}
    return AudioUpload("/tmp/x.wav", "x.wav", 10, plain, lists)


def test_request_defaults_are_openais() -> None:
    """Only model given: json, no language, temperature ladder, no stream, no granularity."""
    r = parse_request(_upload(model="whisper-1"), "transcribe")
    assert (r.model, r.response_format, r.language, r.temperature) == (
        "whisper-1",
        "json",
        None,
        None,
    )
    assert not r.stream and not r.words and r.audio_path == "/tmp/x.wav"


def test_request_reads_every_field() -> None:
    """All fields are read: language lower-cased, granularities, temperature, prompt."""
    r = parse_request(
        _upload(
            model="m",
            language="EN",
            prompt="Quorum",
            response_format="verbose_json",
            temperature="0.3",
            **{"timestamp_granularities[]": ["word", "segment"]},
        ),
        "transcribe",
    )
    assert r.language == "en" and r.prompt == "Quorum" and r.temperature == 0.3
    assert r.granularities == {"word", "segment"} and r.words


def test_request_translation_ignores_language_and_granularity() -> None:
    """Translations take no language or granularities: they are ignored, not refused."""
    r = parse_request(
        _upload(model="m", language="xx", **{"timestamp_granularities[]": ["word"]}), "translate"
    )
    assert r.task == "translate" and r.language is None and not r.granularities


def test_request_stream_with_json() -> None:
    """stream=true with json is a streamed request."""
    assert parse_request(_upload(model="m", stream="true"), "transcribe").stream


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "model"),
        ({"model": " "}, "model"),
        ({"model": "m", "response_format": "xml"}, "response_format"),
        ({"model": "m", "temperature": "hot"}, "temperature"),
        ({"model": "m", "temperature": "1.5"}, "temperature"),
        ({"model": "m", "temperature": "nan"}, "temperature"),
        ({"model": "m", "timestamp_granularities[]": ["word"]}, "timestamp_granularities"),
        (
            {"model": "m", "response_format": "verbose_json", "timestamp_granularities[]": ["x"]},
            "timestamp_granularities",
        ),
        ({"model": "m", "stream": "maybe"}, "stream"),
        ({"model": "m", "stream": "true", "response_format": "srt"}, "stream"),
    ],
)
def test_request_bad_field_is_a_400_naming_it(
    fields: dict[str, str | list[str]], param: str
) -> None:
    """A missing or bad field raises InvalidForm (400) with `param` naming the field."""
    with pytest.raises(InvalidForm) as caught:
        parse_request(_upload(**fields), "transcribe")
    assert caught.value.status == 400 and caught.value.extra["param"] == param


def test_request_unknown_language_is_unsupported_language() -> None:
    """A language Whisper does not know is 400 unsupported_language."""
    with pytest.raises(UnsupportedLanguage) as caught:
        parse_request(_upload(model="m", language="klingon"), "transcribe")
    assert caught.value.code == "unsupported_language"
