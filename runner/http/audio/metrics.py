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
(below 1: faster than real time); its histogram's buckets are `RTF_BUCKETS`
(runner/telemetry/metrics.py).
"""

from __future__ import annotations

from typing import Protocol


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
