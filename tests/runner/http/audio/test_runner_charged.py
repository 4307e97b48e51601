"""Speech is weighed and charged by the seconds of audio, measured, never the file's claim
(issue 36, item 7), synchronous and async alike: the real tiny.en through a real runner,
an espeak-ng recording remuxed into Matroska whose header declares 1.5 s."""

from __future__ import annotations

import struct
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from tests.adapters.whisper.speech import SpeechFiles
from tests.runner.http.audio.conftest import SpeechRunner
from tests.runner.http.audio.runner_kit import transcribe
from tests.support.poll import eventually

pytestmark = pytest.mark.timeout(180)

CLAIM_MS = 1500.0


def _claiming(wav: Path, out: Path) -> Path:
    """`wav`'s samples in Matroska (PCM), its header's `Duration` rewritten to 1.5 s."""
    with av.open(str(wav)) as src, av.open(str(out), "w", format="matroska") as dst:
        rate = src.streams.audio[0].rate
        stream = dst.add_stream("pcm_s16le", rate=rate, layout="mono")
        at = 0
        for frame in src.decode(audio=0):
            frame.pts, frame.time_base = at, Fraction(1, rate)
            at += frame.samples
            dst.mux(stream.encode(frame))
        dst.mux(stream.encode(None))
    data = bytearray(out.read_bytes())
    where = data.find(b"\x44\x89\x88")  # Duration, an 8-byte float (ms)
    assert where > 0
    data[where + 3 : where + 11] = struct.pack(">d", CLAIM_MS)
    out.write_bytes(bytes(data))
    return out


def _seconds(wav: Path) -> float:
    out = subprocess.run(["sox", "--i", "-D", str(wav)], capture_output=True, text=True)
    return float(out.stdout)


def _usage(url: str, tenant: str) -> dict[str, Any]:
    doc = httpx.get(url + "/v1/usage", headers={"X-Tenant-ID": tenant}, timeout=30).json()
    rows = [row for row in doc["data"] if row["tenant"] == tenant and row["model"] == "whisper"]
    assert len(rows) == 1, doc
    row: dict[str, Any] = rows[0]
    return row


def test_speech_charged_by_the_measured_seconds_sync_and_job(
    speech_runner: SpeechRunner, speech: SpeechFiles, tmp_path: Path
) -> None:
    """A recording whose header claims 1.5 s is charged its real seconds in usage, the
    job's progress total is those seconds, and the job's usage record is the synchronous
    request's (one request, ok, the same audio seconds)."""
    url, real = speech_runner.url, _seconds(speech.medium)
    claims = _claiming(speech.medium, tmp_path / "claims.mka")
    sync = transcribe(url, claims, headers={"X-Tenant-ID": "claims-sync"})
    assert sync.status_code == 200, sync.text
    headers = {"X-Tenant-ID": "claims-job", "Prefer": "respond-async"}
    accepted = transcribe(url, claims, headers=headers)
    assert accepted.status_code == 202, accepted.text
    job_url = url + accepted.headers["location"]

    def ended() -> dict[str, Any] | None:
        job: dict[str, Any] = httpx.get(job_url, headers=headers, timeout=10).json()
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None

    job = eventually(ended, timeout=120)
    assert job["status"] == "succeeded", job
    assert job["progress"]["total"] == pytest.approx(real, abs=0.1)
    charged = _usage(url, "claims-sync")
    assert charged["audioSeconds"] == pytest.approx(real, abs=0.1)
    assert charged["requests"] == 1 and charged["requestsByOutcome"]["ok"] == 1
    as_job = _usage(url, "claims-job")
    for key in ("requests", "requestsByOutcome", "audioSeconds", "images"):
        assert as_job[key] == charged[key], (key, as_job, charged)
