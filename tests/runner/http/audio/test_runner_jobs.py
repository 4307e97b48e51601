"""Transcriptions as async jobs through a real runner process: 202, progress, result,
a signed webhook, tenants kept apart, cancel."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from tests.adapters.whisper.speech import SpeechFiles, has_words
from tests.runner.http.audio.conftest import SpeechRunner
from tests.runner.http.audio.runner_kit import SECRET, transcribe, webhook_receiver
from tests.support.poll import eventually

pytestmark = pytest.mark.timeout(120)

ASYNC = {"Prefer": "respond-async", "X-Tenant-ID": "acme"}
STORY_WORDS = ("morning", "train", "station", "seven", "dog", "gate", "apples", "river")


def _job(url: str, job_id: str, tenant: str = "acme") -> httpx.Response:
    return httpx.get(f"{url}/v1/jobs/{job_id}", headers={"X-Tenant-ID": tenant})


def test_runner_job_shows_progress_then_the_result_and_signs_its_webhook(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """Prefer: respond-async answers 202 with the job and its Location; polling shows it
    running with audio seconds done of the total, then succeeded with the transcript; the
    webhook verifies with standardwebhooks and the shared secret."""
    url = speech_runner.url
    with webhook_receiver() as receiver:
        r = transcribe(url, speech.medium, headers=ASYNC, webhook=receiver.url)
        assert r.status_code == 202, r.text
        accepted = r.json()
        job_id = accepted["id"]
        assert accepted["status"] in ("queued", "running")
        assert r.headers["location"] == f"/v1/jobs/{job_id}"
        seen: list[dict[str, Any]] = []

        def finished() -> bool:
            doc = _job(url, job_id).json()
            seen.append(doc)
            return doc["status"] in ("succeeded", "failed", "cancelled")

        eventually(finished, timeout=60, every=0.05)
        hooks = eventually(lambda: receiver.received, timeout=30)
    done = seen[-1]
    assert done["status"] == "succeeded", done
    assert has_words(done["result"]["text"], STORY_WORDS), done["result"]
    progress = [d["progress"] for d in seen if d["status"] == "running" and d["progress"]]
    assert progress and progress[0]["total"] > 20
    assert progress[0]["done"] < progress[0]["total"]
    assert done["progress"]["done"] == done["progress"]["total"]
    payload = Webhook(SECRET).verify(hooks[0].body, hooks[0].headers)
    assert payload["type"] == "job.succeeded" and payload["data"]["id"] == job_id
    assert hooks[0].headers["webhook-id"] and hooks[0].headers["webhook-signature"]
    deliveries = eventually(lambda: _job(url, job_id).json()["webhook"]["deliveries"], timeout=10)
    assert deliveries[0]["status_code"] == 204


def test_runner_job_is_invisible_to_another_tenant(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """Another tenant reading or deleting the job gets 404 job_not_found; its creator reads it."""
    url = speech_runner.url
    r = transcribe(url, speech.hello, headers=ASYNC, response_format="srt")
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    other = _job(url, job_id, tenant="globex")
    assert other.status_code == 404 and other.json()["error"]["code"] == "job_not_found"
    delete = httpx.delete(f"{url}/v1/jobs/{job_id}", headers={"X-Tenant-ID": "globex"})
    assert delete.status_code == 404
    done = eventually(
        lambda: (d := _job(url, job_id).json())["status"] == "succeeded" and d, timeout=60
    )
    assert done["result"]["format"] == "srt" and has_words(done["result"]["content"])


def test_runner_job_delete_cancels_a_running_transcription(
    speech_runner: SpeechRunner, speech: SpeechFiles
) -> None:
    """DELETE on a running job reads cancelled at once, and the worker is free afterwards."""
    url = speech_runner.url
    r = transcribe(url, speech.long, headers=ASYNC)
    job_id = r.json()["id"]
    eventually(lambda: _job(url, job_id).json()["status"] == "running", timeout=30)
    cancel = httpx.delete(f"{url}/v1/jobs/{job_id}", headers={"X-Tenant-ID": "acme"})
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
    assert _job(url, job_id).json()["status"] == "cancelled"
    after = transcribe(url, speech.hello)
    assert after.status_code == 200 and has_words(after.json()["text"])
