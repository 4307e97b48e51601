"""A governed load on its trace (tracing on only; runner/telemetry/tracing.py).

The load task's work runs inside a span of its own, `model load`, a child of the request
that started it (`POST /v1/models/load`, whose own spans show the approval); each stage
the task is written at (downloading, loading, completed, failed, cancelled) is an event
on it, with its progress, so the trace shows where the load's minutes went.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from runner.tasks import LoadTask
from runner.telemetry import tracing

T = TypeVar("T")


def traced(work: Coroutine[Any, Any, T], task: LoadTask) -> Coroutine[Any, Any, T]:
    """`work` (the task's run) inside the task's span; `work` itself when tracing is off."""
    if not tracing.on():
        return work
    attributes = {
        "gen_ai.request.model": task.model_id,
        "quorum.task.id": task.task_id,
        "quorum.operation": "model-load",
    }
    return tracing.within(work, "model load", attributes)


def stage(task: LoadTask) -> None:
    """The stage `task` was written at, as an event on its span."""
    if not tracing.on():
        return
    status = task.status.value
    tracing.event(status, {"quorum.task.progress": task.progress})
    if task.status.terminal:
        tracing.annotate({"quorum.task.status": status})
        if task.load_time_ms is not None:
            tracing.annotate({"quorum.task.load_time_ms": task.load_time_ms})
