"""What the pool tells the scheduler and asks of it (`SchedulerAdmission` implements it)."""

from __future__ import annotations

from typing import Protocol

from runner.scheduler.config import ModelPolicy


class SchedulerLink(Protocol):
    """What the pool tells the scheduler, and asks of it (`SchedulerAdmission`)."""

    def model_ready(self, model: str, concurrency: int, mem_mb: int) -> None: ...

    def load_failed(self, model: str, reason: str) -> None: ...

    def model_stopped(self, model: str) -> None: ...

    def model_crashed(self, model: str, reason: str) -> None: ...

    def request_load(
        self, model: str, policy: ModelPolicy, evict_first: str | None = None
    ) -> str: ...

    def request_unload(self, model: str) -> str: ...


class _NoScheduler:
    """Until `attach`: loads and stops run at once, nothing is reported."""

    def model_ready(self, model: str, concurrency: int, mem_mb: int) -> None:
        return None

    def load_failed(self, model: str, reason: str) -> None:
        return None

    def model_stopped(self, model: str) -> None:
        return None

    def model_crashed(self, model: str, reason: str) -> None:
        return None

    def request_load(self, model: str, policy: ModelPolicy, evict_first: str | None = None) -> str:
        return "absent"

    def request_unload(self, model: str) -> str:
        return "absent"
