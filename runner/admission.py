"""The seam between the data path and scheduling.

The data path asks an `Admission` for a `Grant` before it forwards a request to
an engine, and gives the grant back when the engine is done. The scheduler
(`runner/scheduler/loop.py`, `SchedulerAdmission`) implements it with queues,
priorities and fair sharing; the data path knows only this protocol.

Contract:
- `acquire` returns a grant, or raises a `runner.errors.QuorumError` subclass
  (queue full, queue timeout) that the error map turns into a response.
- If the coroutine awaiting `acquire` is cancelled (the client went away while
  queued), the request is withdrawn and never reaches the engine.
- `release` is called exactly once per grant, with the usage the engine
  reported when it is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What scheduling needs to know about one inference request."""

    request_id: str
    model: str
    tenant: str
    priority: str  # "high" | "normal" | "low"
    est_input_tokens: int
    est_output_tokens: int


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens the engine reported for a finished request."""

    input_tokens: int
    output_tokens: int


@dataclass(slots=True)
class Grant:
    """Permission to send one request to the engine; `queue_wait_ms` is measured."""

    request: AdmissionRequest
    queue_wait_ms: int = 0


class Admission(Protocol):
    async def acquire(self, request: AdmissionRequest) -> Grant: ...

    def release(self, grant: Grant, usage: Usage | None) -> None: ...

    def queue_depth(self) -> int: ...
