"""JobManager: background work, progress, results and errors, tenants, cancel, restart, shutdown.

Tests that take `store` run on the memory store and on a real Redis (conftest.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest

from adapters.errors import EngineUnavailable
from runner.jobs import record
from runner.jobs.errors import InvalidWebhook, JobNotFound, JobsStopped, JobStoreUnavailable
from runner.jobs.manager import JobManager
from runner.jobs.outbound import AllowList, OutboundPolicy
from runner.jobs.progress import ProgressReporter
from runner.jobs.record import Failure, Job, JobStatus, Progress
from runner.jobs.store import JobStore, MemoryJobStore, RedisJobStore
from runner.jobs.webhooks import WebhookSender
from tests.runner.jobs.support import SECRET, Clock, receiver, running
from tests.support.redis_server import RedisServer


class Scripted:
    """A job's work the test steps through: each command is run, then acknowledged."""

    def __init__(self, total: float | None = 10.0) -> None:
        self.total = total
        self.commands: asyncio.Queue[tuple[str, object]] = asyncio.Queue()
        self.acks: asyncio.Queue[None] = asyncio.Queue()
        self.began = False
        self.cancelled = False

    async def __call__(self, progress: ProgressReporter) -> object:
        self.began = True
        try:
            while True:
                op, arg = await self.commands.get()
                if op == "running":
                    await progress.running()
                elif op == "report":
                    assert isinstance(arg, float)
                    await progress.report(arg, self.total)
                elif op == "return":
                    return arg
                elif op == "raise":
                    assert isinstance(arg, BaseException)
                    raise arg
                self.acks.put_nowait(None)
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def step(self, op: str, arg: object = None) -> None:
        """Run one command and wait until the work has done it."""
        self.commands.put_nowait((op, arg))
        await self.acks.get()

    def send(self, op: str, arg: object = None) -> None:
        """Hand over a command that ends the work (no acknowledgement will come)."""
        self.commands.put_nowait((op, arg))


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def _public(host: str, port: int) -> list[str]:
    return ["93.184.216.34"]


LOOPBACK = OutboundPolicy(allow=AllowList.parse("127.0.0.1/32"), resolve=_public)
"""The test receivers listen on loopback, which the operator's allow-list must admit; a
name (`h.test`, for a MockTransport) resolves to a public address."""


def manager(
    store: JobStore,
    clock: Clock | None = None,
    sender: WebhookSender | None = None,
    runner_id: str = "runner-a",
) -> JobManager:
    return JobManager(store, sender, runner_id, clock or Clock())


async def finished(m: JobManager, job_id: str, tenant: str = "acme") -> Job:
    await m.join(job_id)
    return await m.get(job_id, tenant)


async def test_manager_submit_returns_before_the_work_ends(store: JobStore) -> None:
    """submit stores a queued job and returns while the work (a cold load, say) still runs."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    assert job.status is JobStatus.QUEUED and job.id.startswith("job_")
    assert await store.get(job.id) == job
    assert m.active() == 1
    work.send("return", {"text": "late"})
    assert (await finished(m, job.id)).status is JobStatus.SUCCEEDED
    assert m.active() == 0


async def test_manager_polling_shows_progress_then_result(store: JobStore) -> None:
    """GET reads queued, running, progress with a fraction, then the result."""
    clock = Clock()
    m, work = manager(store, clock), Scripted(total=10.0)
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("running")
    got = await m.get(job.id, "acme")
    assert got.status is JobStatus.RUNNING and got.started_at == clock()
    await work.step("report", 3.0)
    assert (await m.get(job.id, "acme")).to_json()["progress"] == {
        "done": 3.0,
        "total": 10.0,
        "fraction": 0.3,
    }
    clock.advance(2)
    work.send("return", {"text": "hello world"})
    done = await finished(m, job.id)
    assert done.status is JobStatus.SUCCEEDED
    assert done.result == {"text": "hello world"}
    assert done.progress == Progress(10.0, 10.0)
    assert done.finished_at == clock()


async def test_manager_work_that_never_reports_still_succeeds(store: JobStore) -> None:
    """A work that neither calls running() nor reports progress goes straight to succeeded."""
    m = manager(store)

    async def quiet(_: ProgressReporter) -> object:
        return ["a", "b"]

    job = await m.submit("image", "acme", "sdxl", quiet)
    done = await finished(m, job.id)
    assert done.status is JobStatus.SUCCEEDED and done.result == ["a", "b"]
    assert done.started_at is not None


async def test_manager_other_tenant_gets_404(store: JobStore) -> None:
    """Another tenant can neither read nor cancel the job: 404, as for an unknown id."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    for call in (m.get(job.id, "globex"), m.cancel(job.id, "globex")):
        with pytest.raises(JobNotFound) as caught:
            await call
        assert caught.value.status == 404 and caught.value.code == "job_not_found"
    assert (await m.get(job.id, "acme")).status is JobStatus.QUEUED
    work.send("return", None)
    await m.join(job.id)


@pytest.mark.parametrize("job_id", ["job_missing", "nope", "job_../../etc", "job_" + "a" * 200])
async def test_manager_unknown_or_malformed_id_is_404(store: JobStore, job_id: str) -> None:
    """Ids that are unknown or cannot be ids answer 404 job_not_found."""
    with pytest.raises(JobNotFound):
        await manager(store).get(job_id, "acme")


async def test_manager_runner_error_becomes_the_job_error(store: JobStore) -> None:
    """A QuorumError from the work fails the job with its code and message."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("report", 1.0)
    work.send("raise", EngineUnavailable("the speech worker died (signal 9)"))
    done = await finished(m, job.id)
    assert done.status is JobStatus.FAILED
    assert done.error == Failure("engine_unavailable", "the speech worker died (signal 9)")


async def test_manager_unexpected_error_is_generic_and_logged(
    store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Any other exception fails the job with "internal error"; the traceback goes to the log."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    with caplog.at_level(logging.ERROR, logger="quorum.jobs"):
        work.send("raise", KeyError("secret internals"))
        done = await finished(m, job.id)
    assert done.error == Failure("internal_error", "internal error")
    assert "secret internals" not in str(done.to_json())
    assert any(r.exc_info and "secret internals" in str(r.exc_info[1]) for r in caplog.records)


async def test_manager_result_that_is_not_json_fails(store: JobStore) -> None:
    """A result that cannot be stored as JSON fails the job instead of losing it."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    work.send("return", {"x": object()})
    done = await finished(m, job.id)
    assert done.status is JobStatus.FAILED and done.error is not None
    assert done.error.code == "internal_error"


async def test_manager_cancel_running_job(store: JobStore) -> None:
    """DELETE on the owning replica: cancelled at once, the work sees CancelledError."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("report", 2.0)
    cancelled = await m.cancel(job.id, "acme")
    assert cancelled.status is JobStatus.CANCELLED
    done = await finished(m, job.id)
    assert done.status is JobStatus.CANCELLED and work.cancelled
    assert done.error is not None and done.error.code == "job_cancelled"
    assert (await m.cancel(job.id, "acme")).status is JobStatus.CANCELLED  # again: unchanged


async def test_manager_cancel_before_the_work_begins() -> None:
    """A job cancelled before its task ran never starts its work (the memory store never yields
    to the loop, so the task has not run when cancel comes)."""
    m, work = manager(MemoryJobStore(Clock())), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    assert (await m.cancel(job.id, "acme")).status is JobStatus.CANCELLED
    await m.join(job.id)
    assert not work.began
    assert (await m.get(job.id, "acme")).status is JobStatus.CANCELLED


async def test_manager_cancel_finished_job_leaves_it(store: JobStore) -> None:
    """Cancelling a job that already succeeded returns it unchanged."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    work.send("return", {"text": "done"})
    await m.join(job.id)
    after = await m.cancel(job.id, "acme")
    assert after.status is JobStatus.SUCCEEDED and after.result == {"text": "done"}


async def test_manager_any_replica_reads_and_cancels(store: JobStore) -> None:
    """Replica B reads A's job; B's cancel is a request A honours at its next progress write."""
    clock = Clock()
    a, b = manager(store, clock, runner_id="runner-a"), manager(store, clock, runner_id="runner-b")
    work = Scripted(total=100.0)
    job = await a.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("report", 10.0)
    seen = await b.get(job.id, "acme")
    assert seen.runner_id == "runner-a" and seen.progress == Progress(10.0, 100.0)

    pending = await b.cancel(job.id, "acme")
    assert pending.status is JobStatus.RUNNING  # not yet: A has not written since
    clock.advance(1.0)
    work.send("report", 11.0)  # A's next write finds the request and cancels the work
    await a.join(job.id)
    assert work.cancelled
    done = await b.get(job.id, "acme")
    assert done.status is JobStatus.CANCELLED and done.progress == Progress(11.0, 100.0)


async def test_manager_progress_writes_are_throttled(store: JobStore) -> None:
    """499 reports at one instant reach the store once per 5%; a small move is written once the
    clock has moved 0.5 s."""
    writes: list[Job] = []
    real_put = store.put

    async def counting_put(job: Job) -> None:
        writes.append(job)
        await real_put(job)

    store.put = counting_put  # type: ignore[method-assign]
    clock = Clock()
    m = manager(store, clock)
    reported, gate = asyncio.Event(), asyncio.Event()

    async def chatty(progress: ProgressReporter) -> object:
        for i in range(1, 500):
            await progress.report(i / 10, 100.0)
        reported.set()
        await gate.wait()
        await progress.report(50.01, 100.0)
        return None

    job = await m.submit("transcription", "acme", "whisper-tiny.en", chatty)
    await reported.wait()
    # submit, then 0.1%, 5.1%, ... 45.1%: one write per 5% step
    assert [w.progress.done for w in writes[1:] if w.progress] == pytest.approx(
        [0.1 + 5 * n for n in range(10)]
    )
    before = len(writes)
    clock.advance(0.5)
    gate.set()
    await m.join(job.id)
    progress = [w.progress for w in writes[before:]]
    assert Progress(50.01, 100.0) in progress


async def test_manager_store_blip_during_progress_does_not_fail_the_job(
    store: JobStore,
) -> None:
    """A progress write the store refuses is skipped; the job goes on and its end is written."""
    real_put = store.put
    failures = [False, False, True]  # submit ok, running+first report ok, the next refused

    async def flaky_put(job: Job) -> None:
        if failures and failures.pop(0):
            raise JobStoreUnavailable("blip")
        await real_put(job)

    store.put = flaky_put  # type: ignore[method-assign]
    clock = Clock()
    m, work = manager(store, clock), Scripted(total=10.0)
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("report", 1.0)
    clock.advance(1)
    await work.step("report", 5.0)  # refused by the store
    assert (await m.get(job.id, "acme")).progress == Progress(1.0, 10.0)
    work.send("return", {"text": "ok"})
    assert (await finished(m, job.id)).status is JobStatus.SUCCEEDED


async def test_manager_job_ended_while_store_down_is_written_when_back(
    store: JobStore,
) -> None:
    """A job that ends while the store is down reads its outcome once the store answers
    again: the refused last write is retried, not lost (it has no next write)."""
    real_put = store.put
    down = asyncio.Event()

    async def put(job: Job) -> None:
        if down.is_set():
            raise JobStoreUnavailable("down")
        await real_put(job)

    store.put = put  # type: ignore[method-assign]
    m = JobManager(store, None, "runner-a", Clock(), store_retry_s=0.01)
    work = Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("running")
    down.set()
    work.send("return", {"text": "during the outage"})
    await m.join(job.id)
    stored = await store.get(job.id)
    assert stored is not None and stored.status is JobStatus.RUNNING
    down.clear()
    while stored is not None and stored.status is JobStatus.RUNNING:
        await asyncio.sleep(0.01)  # the retry runs every 0.01 s
        stored = await store.get(job.id)
    assert stored is not None and stored.status is JobStatus.SUCCEEDED
    assert stored.result == {"text": "during the outage"}
    await m.aclose()


async def test_manager_start_fails_jobs_left_by_a_restart(store: JobStore) -> None:
    """A runner starting with its RUNNER_ID fails the jobs it left running, with that reason."""
    await store.put(running("job_left", "runner-a"))
    await store.put(running("job_other", "runner-b"))
    m = manager(store)
    assert [j.id for j in await m.start()] == ["job_left"]
    left = await m.get("job_left", "acme")
    assert left.status is JobStatus.FAILED
    assert left.error == Failure("job_interrupted", "the runner restarted before the job finished")
    assert (await m.get("job_other", "acme")).status is JobStatus.RUNNING


async def test_manager_start_delivers_webhooks_of_interrupted_jobs() -> None:
    """A job failed at start-up still calls its webhook, and the attempt is recorded."""
    posted: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(request)
        return httpx.Response(204)

    store = MemoryJobStore(Clock())
    await store.put(
        record.start(
            record.new_job(
                "job_left", "image", "acme", "sdxl", "runner-a", 0.0, "https://h.test/hook"
            ),
            1.0,
        )
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        sender = WebhookSender(client, SECRET, clock=Clock(), sleep=Sleeps(), policy=LOOPBACK)
        m = manager(store, sender=sender)
        await m.start()
        await m.join("job_left")
    assert len(posted) == 1 and b'"job.failed"' in posted[0].content
    left = await m.get("job_left", "acme")
    assert [d.status_code for d in left.deliveries] == [204]


async def test_manager_aclose_fails_running_jobs(store: JobStore) -> None:
    """Shutdown writes unfinished jobs failed ("runner shut down") and takes no new ones."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("report", 1.0)
    await m.aclose()
    assert work.cancelled and m.active() == 0
    stored = await store.get(job.id)
    assert stored is not None and stored.status is JobStatus.FAILED
    assert stored.error is not None and stored.error.code == "runner_shutdown"
    with pytest.raises(JobsStopped):
        await m.submit("transcription", "acme", "whisper-tiny.en", Scripted())


async def test_manager_webhook_needs_a_secret_and_a_good_url(store: JobStore) -> None:
    """Without a configured sender or with a bad URL, submit is a 400 and nothing is stored."""
    with pytest.raises(InvalidWebhook, match="not configured"):
        await manager(store).submit("image", "acme", "sdxl", Scripted(), "https://h.test/x")
    async with httpx.AsyncClient() as client:
        m = manager(store, sender=WebhookSender(client, SECRET))
        with pytest.raises(InvalidWebhook, match="http or https"):
            await m.submit("image", "acme", "sdxl", Scripted(), "gopher://h.test/x")
    assert m.active() == 0


async def test_manager_store_down_at_submit_is_503(redis_server: RedisServer) -> None:
    """With Redis down, submit raises JobStoreUnavailable and starts no work."""
    store = RedisJobStore.from_url(redis_server.url, timeout_s=1.0)
    redis_server.stop()
    m, work = manager(store), Scripted()
    with pytest.raises(JobStoreUnavailable):
        await m.submit("transcription", "acme", "whisper-tiny.en", work)
    assert m.active() == 0 and not work.began
    await store.aclose()


async def test_manager_async_job_with_signed_webhook_end_to_end(store: JobStore) -> None:
    """The issue's must-show: progress then result by polling, a webhook that verifies with
    `standardwebhooks` on a real server (after one refused attempt), 404 for another tenant."""
    clock = Clock(time.time())  # the receiver checks the signature's age against its own clock
    sleeps = Sleeps()
    async with receiver(SECRET, statuses=[500]) as hook, httpx.AsyncClient() as client:
        m = manager(
            store, clock, WebhookSender(client, SECRET, clock=clock, sleep=sleeps, policy=LOOPBACK)
        )
        work = Scripted(total=12.5)
        job = await m.submit("transcription", "acme", "whisper-tiny.en", work, hook.url)
        await work.step("report", 5.0)
        polled = (await m.get(job.id, "acme")).to_json()
        assert polled["status"] == "running"
        assert polled["progress"] == {"done": 5.0, "total": 12.5, "fraction": 0.4}
        work.send("return", {"text": "the quick brown fox"})
        done = await finished(m, job.id)

    assert done.status is JobStatus.SUCCEEDED
    assert done.to_json()["result"] == {"text": "the quick brown fox"}
    assert [(d.attempt, d.status_code) for d in done.deliveries] == [(1, 500), (2, 200)]
    assert sleeps.waits == [1.0]
    assert all(r.error is None for r in hook.received) and len(hook.verified) == 2
    event = hook.verified[-1]
    assert event["type"] == "job.succeeded"
    assert event["data"]["id"] == job.id and event["data"]["result"] == {
        "text": "the quick brown fox"
    }
    assert "acme" not in str(event)
    with pytest.raises(JobNotFound):
        await m.get(job.id, "globex")


async def test_manager_cancel_racing_the_end_keeps_the_result_and_webhook() -> None:
    """A cancel that arrives while the job's success is being written leaves it succeeded and
    does not stop its webhook delivery."""
    inner = MemoryJobStore(Clock())
    entered, release, got = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class SlowEnd:
        async def put(self, job: Job) -> None:
            if job.status is JobStatus.SUCCEEDED and not release.is_set():
                entered.set()
                await release.wait()
            await inner.put(job)

        async def get(self, job_id: str) -> Job | None:
            job = await inner.get(job_id)
            got.set()
            return job

        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

    posted: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posted.append(request)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        sender = WebhookSender(client, SECRET, clock=Clock(), sleep=Sleeps(), policy=LOOPBACK)
        m = manager(SlowEnd(), sender=sender)  # type: ignore[arg-type]
        work = Scripted()
        job = await m.submit("image", "acme", "sdxl", work, "https://h.test/hook")
        work.send("return", {"images": 1})
        await entered.wait()  # the success is being written; the store still says queued
        got.clear()
        cancel = asyncio.create_task(m.cancel(job.id, "acme"))
        await got.wait()  # cancel read the store and now waits for the job's lock
        release.set()
        after = await cancel
        await m.join(job.id)

    assert after.status is JobStatus.SUCCEEDED
    assert len(posted) == 1 and b'"job.succeeded"' in posted[0].content
    assert [d.status_code for d in (await inner.get(job.id) or job).deliveries] == [200]


async def test_manager_task_cancelled_from_outside_reads_shut_down(store: JobStore) -> None:
    """A job task cancelled by someone else (the loop stopping) is written failed, no webhook."""
    m, work = manager(store), Scripted()
    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await work.step("report", 1.0)
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == f"job {job.id}"]
    task.cancel()
    await m.join(job.id)
    assert task.cancelled()
    stored = await m.get(job.id, "acme")
    assert stored.status is JobStatus.FAILED
    assert stored.error is not None and stored.error.code == "runner_shutdown"


@pytest.mark.parametrize(("done", "total"), [(-1.0, 10.0), (1.0, 0.0), (float("nan"), None)])
async def test_manager_bad_progress_is_a_value_error(done: float, total: float | None) -> None:
    """Negative or non-finite progress, or a total of zero, raises ValueError in the work."""
    m = manager(MemoryJobStore(Clock()))
    raised: list[BaseException] = []

    async def work(progress: ProgressReporter) -> object:
        try:
            await progress.report(done, total)
        except ValueError as exc:
            raised.append(exc)
        return None

    job = await m.submit("transcription", "acme", "whisper-tiny.en", work)
    await m.join(job.id)
    assert len(raised) == 1
