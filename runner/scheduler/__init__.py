"""Scheduling: who waits, who is served next, who is refused, which models load (see `core.py`)."""

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.effects import Effects, ModelEffects
from runner.scheduler.errors import (
    ModelDoesNotFit,
    ModelEngineCrashed,
    ModelLoadFailed,
    ModelNotLoaded,
    ModelUnloading,
    QueueFull,
    QueueTimeout,
    SchedulerError,
    SchedulerStopped,
    TenantQueueFull,
)
from runner.scheduler.loop import SchedulerAdmission, SchedulerObserver
from runner.scheduler.residency import Residency
from runner.scheduler.stats import QueueStats

__all__ = [
    "Effects",
    "ModelDoesNotFit",
    "ModelEffects",
    "ModelEngineCrashed",
    "ModelLoadFailed",
    "ModelNotLoaded",
    "ModelPolicy",
    "ModelUnloading",
    "QueueFull",
    "QueueStats",
    "QueueTimeout",
    "Residency",
    "Scheduler",
    "SchedulerAdmission",
    "SchedulerConfig",
    "SchedulerError",
    "SchedulerObserver",
    "SchedulerStopped",
    "TenantQueueFull",
]
