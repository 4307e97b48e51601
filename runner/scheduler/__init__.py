"""Scheduling: who waits, who is served next, who is refused (see `core.py`)."""

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.errors import (
    QueueFull,
    QueueTimeout,
    SchedulerError,
    SchedulerStopped,
    TenantQueueFull,
)
from runner.scheduler.loop import SchedulerAdmission, SchedulerObserver
from runner.scheduler.stats import QueueStats

__all__ = [
    "QueueFull",
    "QueueStats",
    "QueueTimeout",
    "Scheduler",
    "SchedulerAdmission",
    "SchedulerConfig",
    "SchedulerError",
    "SchedulerObserver",
    "SchedulerStopped",
    "TenantQueueFull",
]
