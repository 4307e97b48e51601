"""The speech facet: what the audio path (runner/http/audio/) asks of an engine that transcribes,
whatever its kind, and the data that crosses between them.

A speech kind (`Traits.request_path == "audio"`) hands the pool a `Launched` whose `speech`
is a `SpeechEngine`. The runner sends it one file per request (`transcribe`) and reads the
answer as a `TranscriptionStream`: the audio's `Info` first (its duration and language),
then its `Segment`s in order, then the end (`done`, with the engine's time on it). Leaving
the stream early (`async with` left: a client gone, a job deleted) asks the engine to stop;
the slot stays the engine's until `let_go()` returns.

The failures a speech engine answers with are kind-neutral rows of `adapters/errors.py`
(`InvalidAudio`, `UnsupportedLanguage`) or its own rows under `EngineError`.

Pure data and protocols; no I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from adapters.base import Engine


@dataclass(frozen=True, slots=True)
class Info:
    """The audio was decoded: its `duration` in seconds and its (detected) language."""

    request_id: str
    duration: float
    language: str


@dataclass(frozen=True, slots=True)
class Word:
    word: str
    start: float
    end: float
    probability: float


@dataclass(frozen=True, slots=True)
class Segment:
    """One decoded segment, in order (times in seconds); the decoder's figures as Whisper's
    `verbose_json` answers them."""

    request_id: str
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] | None = None


class TranscriptionEnd(Protocol):
    """How a transcription ended, as far as the runner reads it: the engine's time on it."""

    @property
    def engine_ms(self) -> int: ...


class TranscriptionStream(Protocol):
    """One request's answer: `wait_info()`, then its segments by `async for`, then `done`.

    A failed request raises from `wait_info()` or the iteration (a `QuorumError`: the
    engine's refusal, its crash, its silence)."""

    @property
    def done(self) -> TranscriptionEnd | None:
        """How it ended (None: not ended, or ended by an error)."""
        ...

    @property
    def settled(self) -> bool:
        """The engine is done with this request (answered, or it cannot answer any more)."""
        ...

    async def wait_info(self) -> Info:
        """The audio's duration and language (the engine decoded it)."""
        ...

    def __aiter__(self) -> AsyncIterator[Segment]: ...

    async def let_go(self) -> None:
        """Return once the engine is done with this request (after an early close)."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Left early: ask the engine to stop this request at its next segment."""
        ...


class SpeechEngine(Engine, Protocol):
    """One loaded speech model, on the audio path (`/v1/audio/transcriptions`,
    `/v1/audio/translations`)."""

    def transcribe(
        self,
        audio_path: str,
        *,
        request_id: str,
        task: str = "transcribe",
        language: str | None = None,
        prompt: str | None = None,
        temperature: float | None = None,
        word_timestamps: bool = False,
        traceparent: str | None = None,
    ) -> TranscriptionStream:
        """Send the request now (`task`: `transcribe` or `translate` to English); read its
        answer from the returned stream. `traceparent`: the runner's span for it."""
        ...
