"""The audio API through a real runner process: faster-whisper's tiny.en on espeak-ng speech.

The runner starts the speech worker itself (models file, `backend: faster-whisper`); these
tests talk to it over HTTP only, as a client would.
"""

from __future__ import annotations

import os
import select
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from tests.adapters.whisper.speech import SpeechFiles, has_words
from tests.runner.http.audio.conftest import SpeechRunner
from tests.runner.http.audio.runner_kit import (
    TRANSCRIPTIONS,
    loaded,
    metric,
    transcribe,
    worker_pids,
)
from tests.support.poll import eventually

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024
LIMIT = 26_214_400  # AUDIO_MAX_BYTES default: OpenAI's 25 MiB


def test_runner_speech_every_format_carries_the_spoken_words(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """json, text, srt, vtt and verbose_json (segments with start/end) all hold the words,
    with the runner's headers."""
    formats = ("json", "text", "srt", "vtt", "verbose_json")
    with ThreadPoolExecutor(len(formats)) as pool:
        answers = dict(
            zip(
                formats,
                pool.map(
                    lambda f: transcribe(speech_runner.url, speech.hello, response_format=f),
                    formats,
                ),
                strict=True,
            )
        )
    for fmt, r in answers.items():
        assert r.status_code == 200, (fmt, r.text)
        assert r.headers["x-cache-hit"] == "false" and r.headers["x-cache-tokens-reused"] == "0"
        assert int(r.headers["x-gpu-time-ms"]) > 0 and "x-queue-wait-ms" in r.headers
    assert has_words(answers["json"].json()["text"])
    assert answers["text"].headers["content-type"].startswith("text/plain")
    assert has_words(answers["text"].text)
    assert "00:00:00,000 --> " in answers["srt"].text and has_words(answers["srt"].text)
    assert answers["vtt"].text.startswith("WEBVTT") and has_words(answers["vtt"].text)
    verbose = answers["verbose_json"].json()
    assert verbose["task"] == "transcribe" and 2.0 < verbose["duration"] < 5.0
    assert verbose["segments"] and has_words(verbose["text"])
    assert all(0 <= s["start"] < s["end"] for s in verbose["segments"])


def test_runner_speech_stream_sends_deltas_then_the_full_text(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """stream=true: SSE transcript.text.delta events, then transcript.text.done with all text."""
    r = transcribe(speech_runner.url, speech.hello, stream="true")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [
        orjson.loads(line.removeprefix("data: "))
        for line in r.text.splitlines()
        if line.startswith("data: ")
    ]
    assert [e["type"] for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert len(events) >= 2 and events[-1]["type"] == "transcript.text.done"
    assert has_words(events[-1]["text"])
    assert "".join(e["delta"] for e in events[:-1]).strip() == events[-1]["text"]


def test_runner_speech_bad_audio_is_refused_before_the_queue(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """An MP3 header on random bytes is 400 invalid_audio; 0.05 s is 400 audio_too_short."""
    bad = transcribe(speech_runner.url, speech.bad_mp3)
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert bad.json()["error"]["code"] == "invalid_audio"
    short = transcribe(speech_runner.url, speech.short)
    assert short.status_code == 400 and short.json()["error"]["code"] == "audio_too_short"


def _head(port: int, path: str, headers: dict[str, str]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def _status(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def _spooled_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_socket())


def test_runner_speech_30_mib_is_413_before_the_body_is_read(
    speech_runner: SpeechRunner,
) -> None:
    """30 MiB announced by Content-Length: 413 after only the headers were sent. 30 MiB sent
    chunked (no length): 413 once the limit passes, the spool never above the limit, and
    nothing left in the runner's temporary directory."""
    boundary = "quorumboundary"
    ctype = f"multipart/form-data; boundary={boundary}"
    announced = _head(
        speech_runner.runner.port,
        TRANSCRIPTIONS,
        {"Content-Type": ctype, "Content-Length": str(30 * MIB)},
    )
    with announced:
        status, _ = _status(announced)
    assert status == 413

    chunked = _head(
        speech_runner.runner.port,
        TRANSCRIPTIONS,
        {"Content-Type": ctype, "Transfer-Encoding": "chunked"},
    )
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        'filename="big.wav"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    sent, largest, answered = 0, 0, False
    block = os.urandom(MIB)
    with chunked:
        for i in range(31):
            piece = head if i == 0 else block
            try:
                chunked.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            largest = max(largest, _spooled_bytes(speech_runner.tmp))
            if select.select([chunked], [], [], 0.01)[0]:
                answered = True
                break
        status, raw = _status(chunked)
    assert status == 413, raw
    assert answered or sent < 30 * MIB
    assert largest <= LIMIT + 64 * 1024
    assert eventually(lambda: _spooled_bytes(speech_runner.tmp) == 0, timeout=5)


def test_runner_speech_unknown_model_404_wrong_endpoint_400_get_405(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """A model the runner does not have is 404; the speech model named in a chat request is
    400 unsupported_model pointing at the audio API; the audio paths take POST only."""
    r = transcribe(speech_runner.url, speech.hello, model="nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    chat = {"model": "whisper", "messages": [{"role": "user", "content": "hi"}]}
    wrong = httpx.post(speech_runner.url + "/v1/chat/completions", json=chat)
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "unsupported_model"
    assert "/v1/audio/transcriptions" in wrong.json()["error"]["message"]
    get = httpx.get(speech_runner.url + TRANSCRIPTIONS)
    assert get.status_code == 405 and get.headers["allow"] == "POST"


def test_runner_speech_killed_worker_fails_that_request_and_the_restart_serves(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """SIGKILL to the worker mid-transcription: that request is 502 engine_crashed naming
    the signal; the runner stays healthy, restarts the worker (metric counted), and the
    next request is served."""
    url, pid = speech_runner.url, speech_runner.runner.proc.pid
    (worker,) = worker_pids(pid)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(transcribe, url, speech.long)
        eventually(lambda: metric(url, "quorum_requests_in_flight", model="whisper") >= 1)
        os.kill(worker, signal.SIGKILL)
        r = pending.result()
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "engine_crashed" and "SIGKILL" in error["message"], error
    assert httpx.get(url + "/health").status_code in (200, 503)  # serving; model may be down
    eventually(lambda: loaded(url), timeout=60, every=0.1)
    (new_worker,) = worker_pids(pid)
    assert new_worker != worker
    after = transcribe(url, speech.hello)
    assert after.status_code == 200 and has_words(after.json()["text"])
    assert metric(url, "quorum_speech_worker_restarts_total", model="whisper") == 1
    crashed = metric(url, "quorum_transcriptions_total", model="whisper", status="engine_crashed")
    assert crashed == 1
