"""The audio API's form fields, validated into a `SpeechRequest` (pure).

Fields (OpenAI's): `file`, `model`, `language`, `prompt`, `response_format`,
`temperature`, `timestamp_granularities[]`, `stream`. Translations take no `language`
and no granularities (ignored if sent) and always produce English. Unknown fields
are ignored, as OpenAI's newer fields (`chunking_strategy`, `include[]`) would be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adapters.errors import UnsupportedLanguage
from runner.http.audio.errors import InvalidForm
from runner.http.audio.formats import RESPONSE_FORMATS
from runner.http.audio.languages import LANGUAGES
from runner.http.audio.multipart import AudioUpload

TASKS = {
    "/v1/audio/transcriptions": "transcribe",
    "/v1/audio/translations": "translate",
}
GRANULARITIES = frozenset({"word", "segment"})
STREAM_FORMATS = frozenset({"json", "text"})
_TRUE = {"true", "1"}
_FALSE = {"false", "0", ""}


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    """One transcription or translation, as the engine and the renderers need it.

    `temperature` None means OpenAI's 0: faster-whisper's fallback ladder.
    """

    task: str  # "transcribe" | "translate"
    model: str
    audio_path: str
    filename: str
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float | None = None
    granularities: frozenset[str] = frozenset()
    stream: bool = False

    @property
    def words(self) -> bool:
        return "word" in self.granularities


def parse_request(upload: AudioUpload, task: str) -> SpeechRequest:
    """Validate the fields of `upload` for `task`; the first bad one raises, named.

    1. `model`: required, non-empty.
    2. `response_format`: one of json, text, srt, verbose_json, vtt (default json).
    3. `language` (transcriptions): a Whisper language code -> else `unsupported_language`.
    4. `temperature`: a number in [0, 1]; 0 or absent -> None (the fallback ladder).
    5. `timestamp_granularities[]` (transcriptions): word / segment, only with verbose_json.
    6. `stream`: true / false; true only with json or text.
    """
    f = upload.fields
    model = f.get("model", "").strip()  # 1
    if not model:
        raise InvalidForm("the 'model' field is required", param="model")
    response_format = f.get("response_format", "").strip() or "json"  # 2
    if response_format not in RESPONSE_FORMATS:
        allowed = ", ".join(sorted(RESPONSE_FORMATS))
        raise InvalidForm(f"response_format must be one of {allowed}", param="response_format")
    language = None
    granularities: frozenset[str] = frozenset()
    if task == "transcribe":
        language = f.get("language", "").strip().lower() or None  # 3
        if language is not None and language not in LANGUAGES:
            raise UnsupportedLanguage(
                f"language {language!r} is not supported: give an ISO-639-1 code such as 'en'"
            )
        granularities = _granularities(upload, response_format)  # 5
    temperature = _temperature(f.get("temperature", ""))  # 4
    stream = _stream(f.get("stream", ""), response_format)  # 6
    return SpeechRequest(
        task=task,
        model=model,
        audio_path=upload.path,
        filename=upload.filename,
        language=language,
        prompt=f.get("prompt") or None,
        response_format=response_format,
        temperature=temperature,
        granularities=granularities,
        stream=stream,
    )


def _temperature(raw: str) -> float | None:
    if not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidForm(
            "temperature must be a number between 0 and 1", param="temperature"
        ) from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidForm("temperature must be a number between 0 and 1", param="temperature")
    return value or None


def _granularities(upload: AudioUpload, response_format: str) -> frozenset[str]:
    values = [
        *upload.lists.get("timestamp_granularities[]", []),
        *(
            [upload.fields["timestamp_granularities"]]
            if "timestamp_granularities" in upload.fields
            else []
        ),
    ]
    chosen = frozenset(v.strip() for v in values if v.strip())
    unknown = chosen - GRANULARITIES
    if unknown:
        raise InvalidForm(
            "timestamp_granularities[] takes 'word' and/or 'segment'",
            param="timestamp_granularities",
        )
    if chosen and response_format != "verbose_json":
        raise InvalidForm(
            "timestamp_granularities[] needs response_format verbose_json",
            param="timestamp_granularities",
        )
    return chosen


def _stream(raw: str, response_format: str) -> bool:
    value = raw.strip().lower()
    if value in _FALSE:
        return False
    if value not in _TRUE:
        raise InvalidForm("stream must be true or false", param="stream")
    if response_format not in STREAM_FORMATS:
        raise InvalidForm("stream=true needs response_format json or text", param="stream")
    return True
