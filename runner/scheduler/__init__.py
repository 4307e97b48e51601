"""Scheduling: who waits, who is served next, who is refused, which models load (see `core.py`)."""

from runner.scheduler.admission import SchedulerAdmission, SchedulerObserver
from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.effects import Effects, ModelEffects, ModelNotice
from runner.scheduler.errors import (
    ModelDoesNotFit,
    ModelFailed,
    ModelLoadFailed,
    ModelNotLoaded,
    ModelUnloading,
    QueueFull,
    QueueTimeout,
    SchedulerError,
    SchedulerStopped,
    TenantQueueFull,
)
from runner.scheduler.models import ModelState, ModelView
from runner.scheduler.stats import QueueStats

__all__ = [
    "Effects",
    "ModelDoesNotFit",
    "ModelEffects",
    "ModelFailed",
    "ModelLoadFailed",
    "ModelNotLoaded",
    "ModelNotice",
    "ModelPolicy",
    "ModelState",
    "ModelUnloading",
    "ModelView",
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
