"""JobManager: runs each job's work in a background task and keeps its record in the store.

The request that submits a job only stores it and starts a task; the work (a
queue wait, a cold model load, an hour of audio) runs in that task, so no HTTP
timeout applies to it. This replica is the only writer of its jobs' records;
within it, every write of one job goes through that job's lock, so writes
reach the store in the order the transitions were made.

Cancel: a job running here is marked cancelled and its task cancelled at once.
A job owned by another replica gets a cancel *request* in the store; its owner
checks for one each time it writes progress, so that job stops at its next
progress write. A job whose work reports no progress can therefore be cancelled
only through the replica that runs it, and a job whose replica died for good
is never cancelled (it reads `failed` when a runner with the same RUNNER_ID
starts, or disappears after the store's active TTL).

Shutdown (`aclose`): unfinished jobs are written `failed` ("runner shut down")
and their tasks cancelled; their webhooks are not delivered, nor are deliveries
still pending. Jobs found unfinished at start-up (`start`) are written `failed`
and their webhooks delivered.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from runner.errors import HTTP_ERRORS
from runner.floor.pending_writes import RETRY_S, PendingWrites
from runner.jobs import record
from runner.jobs.errors import (
    InvalidWebhook,
    JobNotFound,
    JobsStopped,
    JobStoreUnavailable,
    TooManyJobs,
)
from runner.jobs.progress import ProgressReporter, Throttle, should_write
from runner.jobs.record import JOB_ID_RE, Failure, Job, JobStatus, Progress
from runner.jobs.store import JobStore
from runner.jobs.webhooks import WebhookSender, event_body, message_id
from runner.telemetry import tracing

log = logging.getLogger("quorum.jobs")

Clock = Callable[[], float]
Work = Callable[[ProgressReporter], Awaitable[object]]
Change = Callable[[Job, float], Job]

INTERRUPTED_REASON = "the runner restarted before the job finished"
SHUTDOWN = Failure("runner_shutdown", "the runner shut down before the job finished")
INTERNAL = Failure("internal_error", "internal error")


@dataclass(eq=False)
class _Entry:
    """A job this replica owns: its latest record and the task running or delivering it."""

    job: Job
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    started: bool = False
    written: Progress | None = None
    written_at: float | None = None


class _Reporter:
    """The ProgressReporter one job's work receives."""

    def __init__(self, manager: JobManager, entry: _Entry) -> None:
        self._manager = manager
        self._entry = entry

    async def running(self) -> None:
        await self._manager._progress(self._entry, None)

    async def report(self, done: float, total: float | None = None) -> None:
        if not (math.isfinite(done) and done >= 0) or (
            total is not None and not (math.isfinite(total) and total > 0)
        ):
            raise ValueError(f"progress: done must be >= 0 and total > 0, not {done}/{total}")
        done = done if total is None else min(done, total)
        await self._manager._progress(self._entry, Progress(done, total))


class JobManager:
    """Submits, runs, reads and cancels jobs; one per runner process."""

    def __init__(
        self,
        store: JobStore,
        sender: WebhookSender | None,
        runner_id: str,
        clock: Clock,
        *,
        throttle: Throttle | None = None,
        id_factory: Callable[[], str] = record.new_job_id,
        shutdown_grace_s: float = 5.0,
        store_retry_s: float = RETRY_S,
        max_per_tenant: int | None = None,
        on_finished: Callable[[str, str], None] = lambda _kind, _outcome: None,
    ) -> None:
        """`max_per_tenant`: unfinished jobs one tenant may hold on this replica (None: no
        cap); `on_finished(kind, outcome)`: each job that ends here, once, with its kind and
        outcome (its terminal status): metrics."""
        self._store = store
        self._sender = sender
        self.runner_id = runner_id
        self._clock = clock
        self._throttle = throttle or Throttle()
        self._new_id = id_factory
        self._grace_s = shutdown_grace_s
        self.max_per_tenant = max_per_tenant
        self._entries: dict[str, _Entry] = {}
        self._closing = False
        # A write the store refused while down is written again once it is back: the
        # last write of a job that ended during an outage has no next one to carry it.
        self._writes: PendingWrites[Job, None] = PendingWrites(
            store.put, JobStoreUnavailable, "job", retry_s=store_retry_s
        )
        self.on_finished = on_finished

    def active(self) -> int:
        """Jobs of this replica still running or delivering their webhook."""
        return len(self._entries)

    async def start(self) -> list[Job]:
        """Fail the jobs an earlier process with this RUNNER_ID left unfinished; return them."""
        jobs = await self._store.mark_interrupted(self.runner_id, INTERRUPTED_REASON, self._clock())
        for job in jobs:
            log.warning("job %s failed: %s", job.id, INTERRUPTED_REASON)
            self.on_finished(job.kind, job.status.value)
            if job.webhook is not None and self._sender is not None:
                self._spawn(_Entry(job, started=True), self._deliver)
        return jobs

    async def submit(
        self, kind: str, tenant: str, model: str, work: Work, webhook: str | None = None
    ) -> Job:
        """Store a new job and start its work in the background; the job as first stored.

        1. A runner that is shutting down takes no job (503).
        2. A tenant holding `max_per_tenant` unfinished jobs here takes no more (429).
        3. A webhook needs a secret for the tenant (its own or the shared one) and a URL
           the outbound policy admits: resolved now, nothing inside the runner's network
           (400, and no job).
        4. The job is stored QUEUED before anything runs (503 if the store is down).
        5. The work starts in a task of its own; the caller returns at once.
        """
        if self._closing:  # 1.
            raise JobsStopped()
        cap = self.max_per_tenant
        if cap is not None:  # 2.
            live = sum(
                1 for e in self._entries.values() if e.job.tenant == tenant and not e.job.terminal
            )
            if live >= cap:
                raise TooManyJobs(tenant=tenant, limit=cap, retry_after=5)
        if webhook is not None:  # 3.
            if self._sender is None or not self._sender.signs_for(tenant):
                raise InvalidWebhook("webhooks are not configured for this tenant on this runner")
            await self._sender.policy.check(webhook)
        job = record.new_job(
            self._new_id(), kind, tenant, model, self.runner_id, self._clock(), webhook
        )
        await self._store.put(job)  # 4.
        entry = _Entry(job)
        self._spawn(entry, lambda e: self._run(e, work))  # 5.
        log.info("job %s accepted: %s on %s for tenant %s", job.id, kind, model, tenant)
        return job

    async def get(self, job_id: str, tenant: str) -> Job:
        """The job if `tenant` created it.

        1. An id that cannot be a job's: 404.
        2. No such job in the store (never was, or expired): 404.
        3. Another tenant's job: the same 404, so its existence is not revealed.
        """
        if not JOB_ID_RE.fullmatch(job_id):  # 1.
            raise JobNotFound(job_id=job_id)
        job = await self._store.get(job_id)
        if job is None or job.tenant != tenant:  # 2. 3.
            raise JobNotFound(job_id=job_id)
        return job

    async def cancel(self, job_id: str, tenant: str) -> Job:
        """Cancel the job; the job afterwards (still unfinished if another replica runs it).

        1. The job must be readable by `tenant` (`get`'s 404 rules).
        2. A finished job stays as it is.
        3. Running here: written `cancelled`, its task cancelled.
        4. Owned elsewhere: a cancel request in the store, honoured at the owner's next
           progress write.
        """
        job = await self.get(job_id, tenant)  # 1.
        if job.terminal:  # 2.
            return job
        entry = self._entries.get(job_id)
        if entry is not None:  # 3.
            return await self._cancel_local(entry, cancel_task=True)
        await self._store.request_cancel(job_id)  # 4.
        log.info(
            "job %s: cancel requested from %s (owner %s)", job_id, self.runner_id, job.runner_id
        )
        return job

    async def join(self, job_id: str) -> None:
        """Wait until this replica's task for the job ends (work and webhook); at once if none."""
        entry = self._entries.get(job_id)
        if entry is not None and entry.task is not None:
            await asyncio.wait([entry.task])

    async def aclose(self) -> None:
        """Fail every unfinished job of this replica ("runner shut down") and stop its tasks."""
        self._closing = True
        entries = list(self._entries.values())
        for entry in entries:
            await self._change(entry, lambda job, now: record.fail(job, SHUTDOWN, now))
            if entry.task is not None:
                entry.task.cancel()
        tasks = [e.task for e in entries if e.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self._grace_s)
        await self._writes.aclose()

    # Inside the job's task.

    def _spawn(self, entry: _Entry, body: Callable[[_Entry], Awaitable[None]]) -> None:
        self._entries[entry.job.id] = entry

        async def run() -> None:
            entry.started = True
            job = entry.job
            attributes = {"quorum.job.id": job.id, "quorum.job.kind": job.kind}
            with tracing.span(f"job {job.kind}", attributes) as span:  # tracing on: a span
                await body(entry)
                span.set_attribute("quorum.job.status", entry.job.status.value)

        task = asyncio.create_task(run(), name=f"job {entry.job.id}")
        task.add_done_callback(lambda _: self._entries.pop(entry.job.id, None))
        entry.task = task

    async def _run(self, entry: _Entry, work: Work) -> None:
        """The job's task.

        1. A job cancelled before its task began skips the work.
        2. The work's outcome is recorded: its result, its QuorumError's code and message, or
           a generic internal error (traceback logged).
        3. A CancelledError that this manager caused (the job already reads cancelled) ends
           the work quietly; any other one (shutdown, the loop stopping) fails the job with
           "runner shut down" and ends the task without a webhook.
        4. The webhook, if any, is delivered.
        """
        if not entry.job.terminal:  # 1.
            try:
                await self._outcome(entry, work)  # 2.
            except asyncio.CancelledError:  # 3.
                if self._closing or not entry.job.terminal:
                    await self._change(entry, lambda job, now: record.fail(job, SHUTDOWN, now))
                    raise
            log.info("job %s %s", entry.job.id, entry.job.status.value)
        await self._deliver(entry)  # 4.

    async def _outcome(self, entry: _Entry, work: Work) -> None:
        try:
            result = await work(_Reporter(self, entry))
        except HTTP_ERRORS as exc:
            failure = Failure(str(getattr(exc, "code", "error")), str(exc))
            await self._change(entry, lambda job, now: record.fail(job, failure, now))
        except Exception:
            log.exception("job %s: the work raised", entry.job.id)
            await self._change(entry, lambda job, now: record.fail(job, INTERNAL, now))
        else:
            await self._succeed(entry, result)

    async def _succeed(self, entry: _Entry, result: object) -> None:
        def change(job: Job, now: float) -> Job:
            if job.status is JobStatus.QUEUED:
                job = record.start(job, now)
            return record.succeed(job, result, now)

        try:
            await self._change(entry, change)
        except TypeError:
            log.exception("job %s: the work's result is not JSON", entry.job.id)
            await self._change(entry, lambda job, now: record.fail(job, INTERNAL, now))

    async def _progress(self, entry: _Entry, progress: Progress | None) -> None:
        """Move the job to RUNNING and/or take new progress; write when `should_write` says so,
        and after each write look for a cancel asked on another replica."""
        async with entry.lock:
            job = entry.job
            if job.terminal:  # cancelled meanwhile: the work will see its CancelledError
                return
            now = self._clock()
            due = job.status is JobStatus.QUEUED
            if due:
                job = record.start(job, now)
            if progress is not None:
                job = record.report(job, progress, now)
                if should_write(entry.written, entry.written_at, progress, now, self._throttle):
                    due, entry.written, entry.written_at = True, progress, now
            entry.job = job
            if not due:
                return
            await self._put(job)
        if await self._cancel_asked(job.id):
            await self._cancel_local(entry, cancel_task=False)
            raise asyncio.CancelledError(f"job {job.id} cancelled on another replica")

    async def _cancel_local(self, entry: _Entry, *, cancel_task: bool) -> Job:
        """Write the job cancelled and, if this did it, stop its work; the job afterwards."""
        async with entry.lock:
            if entry.job.terminal:  # it ended meanwhile: leave it and its webhook alone
                return entry.job
            entry.job = record.cancel(entry.job, self._clock())
            await self._put(entry.job)
            self.on_finished(entry.job.kind, entry.job.status.value)
        # No await from here on, so the task cannot move on before it is cancelled.
        if cancel_task and entry.started and entry.task is not None:
            entry.task.cancel()  # a task not started yet sees the terminal job and skips the work
        return entry.job

    async def _deliver(self, entry: _Entry) -> None:
        job = entry.job
        if job.webhook is None or self._sender is None or not job.terminal:
            return

        async def record_attempt(delivery: record.Delivery) -> None:
            await self._change(
                entry, lambda job, now: record.add_delivery(job, delivery, now), finished=True
            )

        delivered = await self._sender.deliver(
            job.webhook, message_id(job), event_body(job), record_attempt, job.tenant
        )
        log.info("job %s webhook %s", job.id, "delivered" if delivered else "gave up")

    # Store access.

    async def _change(self, entry: _Entry, change: Change, *, finished: bool = False) -> Job:
        """Apply `change` to the latest record under the job's lock and write it.

        An unfinished job only (a finished one is returned as it is), unless `finished`.
        """
        async with entry.lock:
            if entry.job.terminal != finished:
                return entry.job
            entry.job = change(entry.job, self._clock())
            await self._put(entry.job)
            if entry.job.terminal and not finished:
                self.on_finished(entry.job.kind, entry.job.status.value)
            return entry.job

    async def _put(self, job: Job) -> None:
        """Write the job; with the store down, the record in memory stays right and is
        written once the store is back, unless a later write carries it first."""
        await self._writes.write(job.id, job)

    async def _cancel_asked(self, job_id: str) -> bool:
        try:
            return await self._store.cancel_requested(job_id)
        except JobStoreUnavailable as exc:
            log.warning("job %s: could not read cancel requests: %s", job_id, exc)
            return False
