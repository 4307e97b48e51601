"""What the pool tells the scheduler about its engines (`SchedulerAdmission` implements it).

The pool reports facts; the scheduler decides what they mean for the model
(runner/scheduler/lifecycle.py). Reasons are in words fit for any tenant: an engine's
log lines never go in them (they stay in the engine's log ring, for admins).
"""

from __future__ import annotations

from typing import Protocol


class ModelReports(Protocol):
    def model_ready(self, model: str, concurrency: int, mem_mb: int) -> None: ...

    def load_failed(
        self, model: str, reason: str, exit_code: int | None = None, cancelled: bool = False
    ) -> None: ...

    def model_stopped(self, model: str, freed_mb: int = 0) -> None: ...

    def model_slept(self, model: str, mem_mb: int, freed_mb: int) -> None: ...

    def model_crashed(self, model: str, reason: str, exit_code: int | None = None) -> None: ...


class NoReports:
    """Until `ModelPool.start`: nothing is reported."""

    def model_ready(self, model: str, concurrency: int, mem_mb: int) -> None:
        return None

    def load_failed(
        self, model: str, reason: str, exit_code: int | None = None, cancelled: bool = False
    ) -> None:
        return None

    def model_stopped(self, model: str, freed_mb: int = 0) -> None:
        return None

    def model_slept(self, model: str, mem_mb: int, freed_mb: int) -> None:
        return None

    def model_crashed(self, model: str, reason: str, exit_code: int | None = None) -> None:
        return None
