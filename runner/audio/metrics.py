"""What the audio path reports, as a Protocol `runner.telemetry.metrics.Metrics` implements.

The first four methods are the data path's, the last two the speech ones, exported as:

| method                  | metric                                | type      | labels        |
|-------------------------|---------------------------------------|-----------|---------------|
| `observe_transcription` | `quorum_audio_seconds_total`          | counter   | model, tenant |
|                         | `quorum_audio_realtime_factor`        | histogram | model         |
|                         | `quorum_transcriptions_total`         | counter   | model, tenant,|
|                         |                                       |           | status        |
| `count_worker_restart`  | `quorum_speech_worker_restarts_total` | counter   | model         |

`status` is the outcome: `ok`, `cancelled`, `invalid_audio`, `engine_crashed`,
`engine_timeout` (the worker was silent, and killed), `error`.
The real-time factor (completed transcriptions only) is engine wall time / audio duration
(below 1: faster than real time); `RTF_BUCKETS` are its histogram buckets.
"""

from __future__ import annotations

from typing import Protocol

RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)


class SpeechMetrics(Protocol):
    def count_request(self, model: str, tenant: str, status: int) -> None:
        """An HTTP request answered with `status` (499: the client went away)."""
        ...

    def count_rejection(self, reason: str, tenant: str) -> None: ...

    def begin_request(self, model: str) -> None:
        """A transcription got its slot (in-flight gauge up)."""
        ...

    def end_request(self, model: str, seconds: float) -> None:
        """It left its slot after `seconds` (in-flight down, duration observed)."""
        ...

    def observe_transcription(
        self, model: str, tenant: str, outcome: str, audio_seconds: float, rtf: float | None
    ) -> None:
        """A transcription ended: `audio_seconds` processed (segments done), its outcome,
        and its real-time factor when it completed (`None` otherwise)."""
        ...

    def count_worker_restart(self, model: str) -> None:
        """The model pool started a new worker after one crashed."""
        ...
