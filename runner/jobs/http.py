"""The job API's HTTP answers, independent of any framework: routes call these and send the result.

    POST <any async-capable endpoint>   Prefer: respond-async  -> accepted_response(job)   202
    GET    /v1/jobs/{id}                                       -> get_job(...)             200
    DELETE /v1/jobs/{id}                                       -> delete_job(...)          200/202

Errors (404 `job_not_found`, 503 `job_store_unavailable`, ...) are raised as
`QuorumError`s for the runner's one error map.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from faults import QuorumError
from runner.jobs.manager import JobManager, Work
from runner.jobs.progress import ProgressReporter
from runner.jobs.record import Job

JOBS_PATH = "/v1/jobs/"


class JobSubmitter(Protocol):
    """Takes `work` as a job; answers (status, body, headers): 202 with the job."""

    async def __call__(
        self, kind: str, tenant: str, model: str, work: Work, webhook: str | None
    ) -> tuple[int, Mapping[str, object], Mapping[str, str]]: ...


Ended = Callable[[str, str, int], None]
"""`ended(tenant, model, status)`: a job's work ended as its synchronous request would
have answered (200, its error's status, 499 when cancelled): the usage's one request
record (the 202 that took the job records none, runner/http/frontend.py)."""


def job_submitter(manager: JobManager, ended: Ended | None = None) -> JobSubmitter:
    """A `JobSubmitter` on the runner's job manager; `ended` is told how each job's work
    ended, once (a job never runs twice: one unfinished at a restart is written failed,
    not run again)."""

    async def submit(
        kind: str, tenant: str, model: str, work: Work, webhook: str | None
    ) -> tuple[int, Mapping[str, object], Mapping[str, str]]:
        if ended is not None:
            work = _counted(work, tenant, model, ended)
        job = await manager.submit(kind, tenant, model, work, webhook)
        answer = accepted_response(job)
        return answer.status, answer.body, answer.headers

    return submit


def _counted(work: Work, tenant: str, model: str, ended: Ended) -> Work:
    """`work` that tells `ended` its status when it ends, however it ends."""

    async def counted(progress: ProgressReporter) -> object:
        status = 500
        try:
            result = await work(progress)
            status = 200
            return result
        except asyncio.CancelledError:
            status = 499
            raise
        except QuorumError as exc:
            status = exc.status
            raise
        finally:
            ended(tenant, model, status)

    return counted


class JobResponse(NamedTuple):
    status: int
    body: dict[str, object]
    headers: dict[str, str]


def _preferences(header: str) -> list[str]:
    """Split a Prefer value on the commas that are outside quoted strings (RFC 7230 lists)."""
    items: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in header:
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return items


def wants_async(prefer_header: str | None) -> bool:
    """Whether a `Prefer` header (RFC 7240) asks for `respond-async`.

    1. No header: no.
    2. The value is a comma-separated list of preferences (quoted commas do not split it;
       several Prefer headers joined with ", " read the same).
    3. A preference's name is what stands before its first `=` or `;`, without spaces,
       compared case-insensitively; `respond-async` anywhere in the list is a yes.
    """
    if not prefer_header:  # 1.
        return False
    for item in _preferences(prefer_header):  # 2.
        name = item.split(";", 1)[0].split("=", 1)[0].strip()  # 3.
        if name.lower() == "respond-async":
            return True
    return False


def job_location(job_id: str) -> str:
    return JOBS_PATH + job_id


def accepted_response(job: Job) -> JobResponse:
    """202 for a request taken as a job: the job (id, status, ...), where to poll it."""
    return JobResponse(
        202,
        job.to_json(),
        {"Location": job_location(job.id), "Preference-Applied": "respond-async"},
    )


def job_response(job: Job) -> JobResponse:
    """200 with the job as its creator reads it."""
    return JobResponse(200, job.to_json(), {})


async def get_job(manager: JobManager, job_id: str, tenant: str) -> JobResponse:
    """`GET /v1/jobs/{id}`: the job, or 404 `job_not_found` (unknown or another tenant's)."""
    return job_response(await manager.get(job_id, tenant))


async def delete_job(manager: JobManager, job_id: str, tenant: str) -> JobResponse:
    """`DELETE /v1/jobs/{id}`: 200 with the job once it is finished or cancelled; 202 when the
    cancel was handed to the replica that runs it and takes effect at its next progress write."""
    job = await manager.cancel(job_id, tenant)
    return JobResponse(200 if job.terminal else 202, job.to_json(), {})
