"""Slot groups: models served by one engine process share that process's slots.

A model's slots are requests it may have in flight at its engine. When several models
run in one engine process (every ComfyUI model on one server: ComfyUI runs one prompt at
a time off one queue; one vLLM serving several models), their slots are the process's:
a request granted to model B while model A's request holds the engine would only wait
inside the engine, where the runner neither orders it fairly nor counts the wait (its
`X-Queue-Wait-Ms` would say 0, its `X-GPU-Time-Ms` would include the wait). So the
models name their engine process in `ModelPolicy.slot_group`, and a request is granted
only while both its model and its group have a free slot; otherwise it waits in the
runner's queue, where the wait is fair, visible and counted.

- A model without a `slot_group` is a group of its own (the common case: behaviour as
  if groups did not exist).
- A group's capacity is the smallest `concurrency` among its members (models on one
  server should declare the same; the smallest wins, so the engine is never handed more
  than any of its models said it takes). Each member is still held to its own.

`SlotCounts` keeps the counts (plain state, no clock, no I/O); `next_ticket` picks the
next waiter among a group's members (pure). `core.Scheduler` uses both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.events import Band, Ticket
from runner.scheduler.models import ModelTable
from runner.scheduler.waiting import Chooser, WaitingRoom


class SlotCounts:
    """Requests in flight per model, read per model and per slot group."""

    def __init__(self, config: SchedulerConfig, table: ModelTable) -> None:
        self._config = config
        self._table = table
        self.by_model: Counter[str] = Counter()

    def started(self, model: str) -> None:
        self.by_model[model] += 1

    def finished(self, model: str) -> None:
        self.by_model[model] -= 1
        if self.by_model[model] <= 0:
            del self.by_model[model]

    def concurrency(self, model: str) -> int:
        """The model's own slots (its engine's, once `ModelReady` said)."""
        record = self._table.get(model)
        return self._config.concurrency(model) if record is None else record.concurrency

    def members(self, model: str) -> list[str]:
        """The models sharing `model`'s engine process (itself included)."""
        record = self._table.records.get(model)
        group = None if record is None else record.policy.slot_group
        if group is None:
            return [model]
        return [m for m, r in self._table.records.items() if r.policy.slot_group == group]

    def capacity(self, model: str) -> int:
        """The slots of `model`'s group: the smallest concurrency among its members."""
        return min(self.concurrency(m) for m in self.members(model))

    def group_in_flight(self, model: str) -> int:
        """Requests in flight on `model`'s engine process, all its members together."""
        return sum(self.by_model[m] for m in self.members(model))

    def has_room(self, model: str) -> bool:
        """A request for `model` may be granted: its model and its group have a free slot.
        (On every request: a model in no group is answered without building its group.)"""
        if self.by_model[model] >= self.concurrency(model):
            return False
        record = self._table.records.get(model)
        if record is None or record.policy.slot_group is None:
            return True
        return self.group_in_flight(model) < self.capacity(model)


def next_ticket(
    models: Iterable[str],
    waiting: WaitingRoom,
    choose: Chooser,
    eligible: Callable[[str], bool] = lambda _tenant: True,
) -> Ticket | None:
    """The next waiter to grant a freed group slot to, among `models` (the group's members
    that are open and have a slot of their own); `None` if none of them has a waiter.

    1. The most important band any of them has a waiter of an `eligible` tenant in (high,
       normal, low); a tenant at its in-flight cap is not eligible, and its waiters keep
       their place.
    2. Among the eligible tenants' heads in that band, across those models (oldest first),
       the one `choose` picks: fair share across the tenants of the shared engine, as
       within one model.

    The ticket is left in the waiting room; the caller removes it.
    """
    candidates = list(models)
    for band in (Band.HIGH, Band.NORMAL, Band.LOW):  # 1
        fifos = [waiting.band(model, band) for model in candidates]
        heads = [
            queue[0]
            for fifo in fifos
            for tenant, queue in fifo.items()
            if queue and eligible(tenant)
        ]
        if heads:  # 2
            return choose(sorted(heads, key=lambda ticket: ticket.ticket_id))
    return None
