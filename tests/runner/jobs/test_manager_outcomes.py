"""JobManager's `on_finished`: every job that ends is counted once, by kind and outcome
(`quorum_jobs_total`, runner/telemetry/outcome_metrics.py)."""

from __future__ import annotations

import asyncio

import pytest

from adapters.errors import EngineUnavailable
from runner.jobs import record
from runner.jobs.manager import INTERRUPTED_REASON, JobManager
from runner.jobs.progress import ProgressReporter
from runner.jobs.record import JobStatus
from runner.jobs.store import MemoryJobStore
from tests.runner.jobs.support import Clock

pytestmark = pytest.mark.timeout(30)


def _counted(store: MemoryJobStore) -> tuple[JobManager, list[tuple[str, str]]]:
    """A manager on `store`, and the outcomes it counts (its `on_finished`)."""
    seen: list[tuple[str, str]] = []
    manager = JobManager(
        store, None, "r", Clock(), on_finished=lambda kind, outcome: seen.append((kind, outcome))
    )
    return manager, seen


async def _ok(_: ProgressReporter) -> object:
    return {"data": []}


async def _fails(_: ProgressReporter) -> object:
    raise EngineUnavailable("engine gone")


async def _bug(_: ProgressReporter) -> object:
    raise ValueError("a bug")


async def test_jobs_outcomes_succeeded_failed_and_internal_each_counted_once() -> None:
    """A job that succeeds, one that fails with a runner error and one whose work has a
    bug: each counted once with its kind and terminal status."""
    m, seen = _counted(MemoryJobStore(Clock()))
    for kind, work in (("image_generation", _ok), ("transcription", _fails), ("x", _bug)):
        job = await m.submit(kind, "acme", "m", work)
        await m.join(job.id)
    assert seen == [
        ("image_generation", "succeeded"),
        ("transcription", "failed"),
        ("x", "failed"),
    ]


async def test_jobs_outcomes_cancelled_counted_once_even_when_cancelled_twice() -> None:
    """A cancelled job is counted cancelled once; cancelling it again counts nothing."""
    m, seen = _counted(MemoryJobStore(Clock()))
    job = await m.submit("translation", "acme", "m", _ok)
    assert (await m.cancel(job.id, "acme")).status is JobStatus.CANCELLED
    await m.join(job.id)
    await m.cancel(job.id, "acme")
    assert seen == [("translation", "cancelled")]


async def test_jobs_outcomes_shutdown_and_interrupted_jobs_count_as_failed() -> None:
    """A job failed by shutdown, and one a restarted runner finds unfinished, read failed."""
    store = MemoryJobStore(Clock())
    first, seen = _counted(store)

    async def forever(progress: ProgressReporter) -> object:
        await progress.running()
        await asyncio.Event().wait()
        return None

    await first.submit("transcription", "acme", "m", forever)
    await first.aclose()
    assert seen == [("transcription", "failed")]

    left = record.start(record.new_job("job_left", "image_generation", "acme", "m", "r", 0.0), 0.0)
    await store.put(left)
    restarted, counted = _counted(store)
    failed = await restarted.start()
    assert [j.id for j in failed] == ["job_left"]
    assert failed[0].error is not None and failed[0].error.message == INTERRUPTED_REASON
    assert counted == [("image_generation", "failed")]
