"""`Scheduler.admit_now`, the data path's grant of a request nobody waits before: it
leaves the scheduler exactly as `handle(RequestArrived)` does when that grants at once
(and after the same releases), and changes nothing (returns None) whenever the event
might not grant at once."""

from __future__ import annotations

import pytest

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.core import Scheduler
from runner.scheduler.events import RequestArrived, ServeDone
from runner.scheduler.grants import AdmissionRequest, Usage
from tests.runner.scheduler.fakes import Driver

pytestmark = pytest.mark.timeout(30)

CONFIG = SchedulerConfig(max_queue_depth=8, model_concurrency={"m": 3})


def _request(tenant: str, tokens: tuple[int, int]) -> AdmissionRequest:
    return AdmissionRequest(f"r-{tenant}", "m", tenant, "normal", *tokens)


def _seen(core: Scheduler, now: float) -> object:
    """Everything the scheduler tells about its requests."""
    return (
        dict(core.slots.by_model),
        core.caps.by_tenant(),
        {t: core.counter(t) for t in ("a", "b")},
        core.stats(now),
        core.retry_after_s(now),
        core.models(),
    )


def _ready() -> Driver:
    d = Driver(CONFIG, now=10.0)
    d.ready("m", 0, concurrency=3)
    return d


def test_admit_now_leaves_the_scheduler_as_the_granted_event_does() -> None:
    by_event, direct = _ready(), _ready()
    arrivals = [("a", (10, 10)), ("b", (40, 5)), ("a", (3, 200))]
    for ticket_id, (tenant, tokens) in enumerate(arrivals, start=1):
        by_event.now = direct.now = 10.0 + ticket_id
        request = _request(tenant, tokens)
        by_event.core.handle(RequestArrived(ticket_id, request, by_event.now))
        ticket = direct.core.admit_now(ticket_id, request, direct.now)
        assert ticket is not None and ticket.ticket_id == ticket_id
        assert by_event.effects.granted[-1] == (ticket_id, 0)
        assert _seen(direct.core, direct.now) == _seen(by_event.core, by_event.now)
    for ticket_id, usage in [(2, Usage(40, 9)), (1, None), (3, Usage(3, 150))]:
        by_event.now = direct.now = by_event.now + 0.5
        for d in (by_event, direct):
            d.core.handle(ServeDone(ticket_id, usage, d.now))
        assert _seen(direct.core, direct.now) == _seen(by_event.core, by_event.now)


def test_admit_now_changes_nothing_where_the_event_might_not_grant_at_once() -> None:
    """A tenant at its cap, somebody waiting (here that tenant's request, with slots
    free), no slot left: None, and the scheduler as before."""
    d = Driver(
        SchedulerConfig(
            max_queue_depth=8, model_concurrency={"m": 3}, tenant_in_flight_caps={"b": 1}
        )
    )
    d.ready("m", 0, concurrency=3)
    assert d.core.admit_now(1, _request("b", (1, 1)), d.now) is not None
    before = _seen(d.core, d.now)
    assert d.core.admit_now(2, _request("b", (1, 1)), d.now) is None  # b at its cap
    assert _seen(d.core, d.now) == before
    d.arrive("b")  # ticket 1 of the driver's ids: b waits for its cap, a slot is free
    assert d.core.queue_depth() == 1
    waiting = _seen(d.core, d.now)
    assert d.core.admit_now(10, _request("a", (1, 1)), d.now) is None  # somebody waits
    assert _seen(d.core, d.now) == waiting
    for ticket_id in (11, 12):
        d.core.handle(RequestArrived(ticket_id, _request("a", (1, 1)), d.now))
    assert d.core.slots.by_model["m"] == 3  # full
    assert d.core.admit_now(13, _request("a", (1, 1)), d.now) is None
