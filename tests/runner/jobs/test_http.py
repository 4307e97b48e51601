"""The job API's HTTP answers: Prefer parsing, 202 + Location, GET and DELETE."""

from __future__ import annotations

import asyncio

import pytest

from runner.jobs.errors import JobNotFound
from runner.jobs.http import accepted_response, delete_job, get_job, wants_async
from runner.jobs.manager import JobManager
from runner.jobs.progress import ProgressReporter
from runner.jobs.store import MemoryJobStore
from tests.runner.jobs.support import Clock, queued


@pytest.mark.parametrize(
    "value",
    [
        "respond-async",
        "Respond-Async",
        "respond-async, wait=10",
        "wait=10, respond-async",
        "handling=lenient,respond-async;foo=bar",
        '  respond-async  ; x="a,b"',
        "respond-async=",
        'return=minimal, foo="x\\"y", RESPOND-ASYNC',
    ],
)
def test_http_wants_async_yes(value: str) -> None:
    """respond-async among the comma-separated preferences, any case, with parameters."""
    assert wants_async(value)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "wait=10",
        "return=minimal",
        "respond-asynchronously",
        "xrespond-async",
        'foo="respond-async"',
        'foo="a, respond-async, b"',
        "handling=respond-async",
    ],
)
def test_http_wants_async_no(value: str | None) -> None:
    """No header, other preferences, or the word only inside a value or a quoted string."""
    assert not wants_async(value)


def test_http_accepted_response() -> None:
    """202 with the job (id, status) and Location, Preference-Applied headers."""
    job = queued("job_abc")
    status, body, headers = accepted_response(job)
    assert status == 202
    assert body["id"] == "job_abc" and body["status"] == "queued" and body["object"] == "job"
    assert headers == {"Location": "/v1/jobs/job_abc", "Preference-Applied": "respond-async"}


async def test_http_get_and_delete_job() -> None:
    """GET answers 200 with the job; DELETE 200 with it cancelled; another tenant gets 404."""
    store = MemoryJobStore(Clock())
    manager = JobManager(store, None, "runner-a", Clock())
    never = asyncio.Event()

    async def work(_: ProgressReporter) -> object:
        await never.wait()
        return None

    job = await manager.submit("transcription", "acme", "whisper-tiny.en", work)
    got = await get_job(manager, job.id, "acme")
    assert got.status == 200 and got.body["id"] == job.id and got.headers == {}
    with pytest.raises(JobNotFound):
        await get_job(manager, job.id, "globex")
    with pytest.raises(JobNotFound):
        await delete_job(manager, job.id, "globex")
    gone = await delete_job(manager, job.id, "acme")
    assert gone.status == 200 and gone.body["status"] == "cancelled"
    await manager.join(job.id)


async def test_http_delete_on_another_replica_is_202() -> None:
    """DELETE through a replica that does not run the job: 202, the cancel is pending."""
    store = MemoryJobStore(Clock())
    await store.put(queued("job_elsewhere", runner_id="runner-b"))
    manager = JobManager(store, None, "runner-a", Clock())
    answer = await delete_job(manager, "job_elsewhere", "acme")
    assert answer.status == 202 and answer.body["status"] == "queued"
    assert await store.cancel_requested("job_elsewhere")
