"""Governed operations on one runner, as flows: load (and follow its task), unload, flush,
cancel a load; and a pool's load, sent to the runner its token is addressed to.

The load follows the contract's flow (seed 002, `executeModelLoad` / `pollModelLoadTask`):
POST /v1/models/load answers 202 with a task; GET /v1/models/load/{taskId} until the task
ends. Every poll reports progress and eta to the caller's callback; `completed` returns a
`LoadResult`, `failed` raises `LoadFailed` with the task's error, `cancelled` raises
`LoadCancelled`.

Cancelling: the caller may stop following at any time (cancel the asyncio task, raise
from the callback, Ctrl-C); the load goes on at the runner. Stopping the load itself is a
governed operation of its own: `task-cancel`, signed for that task id (so only after the
202), sent with `cancel_flow`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from client.core import PoolCore, refresh
from client.errors import (
    LoadCancelled,
    LoadFailed,
    LoadTimedOut,
    RunnerRefused,
    RunnerUnreachable,
)
from client.steps import Call, Flow, NoReply, Reply, Sleep, expect, refusal
from client.tokens import OpToken

TERMINAL = ("completed", "failed", "cancelled")
MAX_POLL_FAILURES = 10
"""Polls in a row without an answer before following gives up (RunnerUnreachable)."""


@dataclass(frozen=True, slots=True)
class LoadProgress:
    """One look at a load task."""

    url: str
    task_id: str
    model_id: str
    status: str  # accepted (the 202) | queued | downloading | loading | completed | failed
    #              | cancelled
    progress: float  # 0..1
    eta: float | None  # seconds, as the runner estimates it
    error: str | None = None

    @classmethod
    def of(cls, url: str, model_id: str, doc: Mapping[str, Any]) -> LoadProgress:
        eta = doc.get("eta")
        error = doc.get("error")
        return cls(
            url,
            str(doc.get("taskId", "")),
            str(doc.get("modelId", model_id)),
            str(doc.get("status", "")),
            float(doc.get("progress") or 0.0),
            float(eta) if isinstance(eta, int | float) else None,
            error if isinstance(error, str) else None,
        )


@dataclass(frozen=True, slots=True)
class LoadResult:
    url: str
    task_id: str
    model_id: str
    gpu_memory_used_mb: int | None
    load_time_ms: int | None


ProgressCallback = Callable[[LoadProgress], object]


def load_flow(
    url: str,
    token: OpToken,
    *,
    model: str | None = None,
    progress: ProgressCallback | None = None,
    interval_s: float = 1.0,
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    epoch: Callable[[], float] = time.time,
) -> Flow[LoadResult]:
    """Submit a governed load and follow its task to the end.

    1. The body is the one the signers approved (`token.body()`); a `model` that differs
       from the token's is refused here, before anything is sent (ValueError).
    2. POST /v1/models/load must answer 202 (else RunnerRefused: 400/401/403/404/409/503).
    3. Every `interval_s`: GET the task, report it to `progress`.
       `completed` -> LoadResult; `failed` -> LoadFailed; `cancelled` -> LoadCancelled;
       404 -> RunnerRefused (the task is gone); no answer MAX_POLL_FAILURES times in a
       row -> RunnerUnreachable; past `timeout_s` -> LoadTimedOut (the load goes on).
    """
    if token.operation != "model-load":  # 1
        raise ValueError(f"the token approves {token.operation!r}, not model-load")
    if model is not None and token.model_id != model:
        raise ValueError(f"the token approves loading {token.model_id!r}, not {model!r}")
    model_id = token.model_id or ""
    started = clock()
    reply = yield from expect(
        Call("POST", f"{url}/v1/models/load", json=token.body()), 202, epoch()
    )
    accepted = {**(reply.json() or {}), "status": "accepted"}  # the 202 says "loading" always
    seen = LoadProgress.of(url, model_id, accepted)  # 2
    if progress is not None:
        progress(seen)
    failures = 0
    while True:  # 3
        yield Sleep(interval_s)
        outcome = yield Call("GET", f"{url}/v1/models/load/{seen.task_id}")
        if isinstance(outcome, NoReply):
            failures += 1
            if failures >= MAX_POLL_FAILURES:
                raise RunnerUnreachable(url, outcome.reason)
        else:
            assert isinstance(outcome, Reply)
            failures = 0
            if outcome.status != 200:
                raise refusal(outcome, epoch())
            doc = outcome.json() or {}
            seen = LoadProgress.of(url, model_id, doc)
            if progress is not None:
                progress(seen)
            if seen.status == "completed":
                return LoadResult(
                    url,
                    seen.task_id,
                    seen.model_id,
                    _opt_int(doc.get("gpuMemoryUsedMB")),
                    _opt_int(doc.get("loadTimeMs")),
                )
            if seen.status == "failed":
                raise LoadFailed(url, seen.task_id, seen.model_id, seen.error or "no reason given")
            if seen.status == "cancelled":
                raise LoadCancelled(url, seen.task_id, seen.model_id, seen.error or "cancelled")
        if timeout_s is not None and clock() - started > timeout_s:
            raise LoadTimedOut(url, seen.task_id, timeout_s)


def task_flow(url: str, task_id: str, epoch: Callable[[], float] = time.time) -> Flow[LoadProgress]:
    """One look at a load task (404 -> RunnerRefused)."""
    reply = yield from expect(Call("GET", f"{url}/v1/models/load/{task_id}"), 200, epoch())
    return LoadProgress.of(url, "", reply.json() or {})


def cancel_flow(
    url: str, task_id: str, token: OpToken, epoch: Callable[[], float] = time.time
) -> Flow[LoadProgress]:
    """Cancel a load task with a `task-cancel` token signed for its id."""
    if token.operation != "task-cancel":
        raise ValueError(f"the token approves {token.operation!r}, not task-cancel")
    if token.params.get("taskId") != task_id:
        raise ValueError(f"the token approves cancelling {token.params.get('taskId')!r}")
    body = {"verifiedOpToken": token.raw}
    call = Call("DELETE", f"{url}/v1/models/load/{task_id}", json=body)
    reply = yield from expect(call, 200, epoch())
    return LoadProgress.of(url, token.model_id or "", reply.json() or {})


def governed_flow(
    url: str, path: str, token: OpToken, operation: str, epoch: Callable[[], float] = time.time
) -> Flow[dict[str, object]]:
    """POST the body the signers approved for `operation` (unload, flush); 200 -> its JSON."""
    if token.operation != operation:
        raise ValueError(f"the token approves {token.operation!r}, not {operation}")
    reply = yield from expect(Call("POST", url + path, json=token.body()), 200, epoch())
    doc = reply.json()
    if not isinstance(doc, dict):
        raise RunnerRefused(url, reply.status, "bad_answer", "the answer is not a JSON object")
    return doc


def pool_load(
    pool: PoolCore,
    token: OpToken,
    *,
    model: str | None = None,
    url: str | None = None,
    progress: ProgressCallback | None = None,
    interval_s: float = 1.0,
    timeout_s: float | None = None,
) -> Flow[LoadResult]:
    """Load what `token` approves on the runner it is addressed to (the runner whose
    `runnerId` is its `aud`, once capabilities are fresh), or on `url` (`load_flow`)."""
    yield from refresh(pool)
    result = yield from load_flow(
        pool.target(token, url),
        token,
        model=model,
        progress=progress,
        interval_s=interval_s,
        timeout_s=timeout_s,
        clock=pool.clock,
        epoch=pool.epoch,
    )
    return result


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
