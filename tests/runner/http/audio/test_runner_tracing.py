"""A transcription on the caller's trace: the runner's span for the worker's part, and the
worker's log line naming the trace (the real tiny.en worker; runner/http/audio/service.py)."""

from __future__ import annotations

import secrets

import httpx
import pytest

from tests.adapters.whisper.speech import SpeechFiles
from tests.runner.http.audio.runner_kit import transcribe, whisper_models_file
from tests.support.otlp_receiver import OtlpReceiver, Received, otlp_receiver
from tests.support.poll import eventually
from tests.support.runner_proc import start_runner
from tests.support.tokens import FAIRNESS, gateway_env

pytestmark = pytest.mark.timeout(180)


def test_tracing_transcription_span_and_the_workers_log(
    whisper_model: str, speech: SpeechFiles
) -> None:
    """A transcription carrying `traceparent`: a client span `transcribe whisper` under the
    server span (the audio's seconds, those done, the worker's time; no words of it), and
    the worker's log (GET /v1/models/whisper/logs) names the trace id."""
    models = whisper_models_file(whisper_model, preload=True)
    with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "WHISPER_CPU_THREADS": "1",
            **gateway_env(),
        }
        with start_runner(models_file=models, env=env, ready_timeout=60) as runner:
            trace_id = secrets.token_hex(16)
            parent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
            headers = {FAIRNESS: "acme", "traceparent": parent}
            r = transcribe(runner.url, speech.hello, headers=headers)
            assert r.status_code == 200, r.text

            def spans(rec: OtlpReceiver) -> dict[str, Received] | None:
                got = {s.name: s for s in rec.in_trace(trace_id)}
                names = ("POST /v1/audio/transcriptions", "transcribe whisper")
                return got if all(n in got for n in names) else None

            got = receiver.wait_for(spans, 30, "the transcription's spans")
            server, worker = got["POST /v1/audio/transcriptions"], got["transcribe whisper"]
            assert worker.parent_id == server.span_id and worker.kind == "client"
            assert worker.attributes["gen_ai.request.model"] == "whisper"
            assert worker.attributes["quorum.audio.seconds_done"] > 0
            assert worker.attributes["quorum.engine_ms"] > 0
            assert "hello" not in str([s.attributes for s in receiver.in_trace(trace_id)])

            def logged() -> list[str]:
                url = runner.url + "/v1/models/whisper/logs"
                lines: list[str] = httpx.get(url, headers={FAIRNESS: "ops"}).json()["lines"]
                return [line for line in lines if f"trace_id={trace_id}" in line]

            assert eventually(logged, 10, "the worker's line with the trace id")
