"""The scheduler core, driven event by event against recording effects (no loop, no sleeps)."""

from __future__ import annotations

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.errors import QueueFull, QueueTimeout, SchedulerStopped, TenantQueueFull
from runner.scheduler.events import RunnerStopping
from tests.runner.scheduler.fakes import Driver


def one_slot(**kwargs: object) -> SchedulerConfig:
    return SchedulerConfig(default_concurrency=1, **kwargs)  # type: ignore[arg-type]


def test_scheduler_grants_at_once_when_a_slot_is_free() -> None:
    """A request for a model with free slots is granted immediately with zero wait."""
    d = Driver(SchedulerConfig(default_concurrency=2))
    a, b = d.arrive(), d.arrive()
    assert d.effects.granted == [(a, 0), (b, 0)]
    assert d.core.in_flight("m") == 2
    assert d.core.queue_depth() == 0


def test_scheduler_high_after_ten_lows_is_granted_first() -> None:
    """With the model's concurrency full, a high request arriving after ten lows runs first."""
    d = Driver(one_slot(low_aging_s=None))
    busy = d.arrive()
    lows = [d.arrive(f"low{i}", priority="low") for i in range(10)]
    high = d.arrive("vip", priority="high")
    d.done(busy)
    assert d.effects.granted_ids == [busy, high]
    d.done(high)
    assert d.effects.granted_ids[2] == lows[0]


def test_scheduler_bands_order_high_normal_low() -> None:
    """Waiters are served high band first, then normal, then low."""
    d = Driver(one_slot(low_aging_s=None))
    busy = d.arrive()
    low, normal, high = d.arrive(priority="low"), d.arrive(), d.arrive(priority="high")
    for ticket in (busy, high, normal):
        d.done(ticket)
    assert d.effects.granted_ids == [busy, high, normal, low]


def test_scheduler_fifo_within_a_tenant() -> None:
    """One tenant's waiting requests are granted in arrival order."""
    d = Driver(one_slot())
    tickets = [d.arrive("a") for _ in range(5)]
    for ticket in tickets[:-1]:
        d.done(ticket)
    assert d.effects.granted_ids == tickets


def test_scheduler_least_served_tenant_goes_first() -> None:
    """Within a band the tenant with less weighted service is served before an earlier arrival."""
    d = Driver(one_slot())
    first = d.arrive("heavy", tokens=(1000, 1000))
    second, third = d.arrive("heavy"), d.arrive("heavy")
    light = d.arrive("light")  # lifted to heavy's counter: no credit for arriving late
    d.done(first)
    d.done(second)
    d.done(light)
    assert d.effects.granted_ids == [first, second, light, third]


def test_scheduler_usage_corrects_the_estimate() -> None:
    """The engine's reported usage replaces the admission estimate in the tenant's counter."""
    d = Driver(one_slot())
    t = d.arrive("a", tokens=(100, 1000))
    assert d.core.counter("a") == 2100
    d.done(t, usage=(100, 10))
    assert d.core.counter("a") == 120


def test_scheduler_weights_give_proportional_service() -> None:
    """A tenant with weight 2 gets twice the grants of a weight-1 tenant while both wait."""
    d = Driver(one_slot(tenant_weights={"gold": 2.0}, max_queue_depth=1000))
    busy = d.arrive("x")
    for _ in range(60):
        d.arrive("gold")
        d.arrive("base")
    current = busy
    for _ in range(30):
        d.done(current)
        current = d.effects.granted_ids[-1]
    served = d.effects.granted_ids[1:]
    gold = sum(1 for t in served if t % 2 == 0)
    assert (gold, len(served) - gold) == (20, 10)


def test_scheduler_returning_tenant_banks_no_credit() -> None:
    """A tenant idle while others were served is lifted to the backlog's minimum counter."""
    d = Driver(one_slot(max_queue_depth=100))
    current = d.arrive("a")
    for _ in range(10):
        d.arrive("a")
        d.arrive("b")
    for _ in range(6):
        d.done(current)
        current = d.effects.granted_ids[-1]
    floor = min(d.core.counter("a"), d.core.counter("b"))
    d.arrive("late")
    assert d.core.counter("late") == floor


def test_scheduler_low_request_is_promoted_after_aging() -> None:
    """A low request older than the aging age is served ahead of later normal ones."""
    d = Driver(one_slot(low_aging_s=5.0, queue_timeout_s=None))
    busy = d.arrive()
    low = d.arrive("patient", priority="low")
    d.tick(6.0)
    normal = d.arrive("eager")
    d.done(busy)
    assert d.effects.granted_ids == [busy, low]
    assert d.core.stats(d.now).depth_by_priority == {"low": 0, "normal": 1, "high": 0}
    d.done(low)
    assert d.effects.granted_ids[-1] == normal


def test_scheduler_queue_full_rejects_with_the_seed_body() -> None:
    """Beyond max_queue_depth waiting, a request is refused with queue_full, depth and wait."""
    d = Driver(one_slot(max_queue_depth=2))
    d.arrive()
    d.arrive(), d.arrive()
    refused = d.arrive()
    error = d.effects.rejection(refused)
    assert isinstance(error, QueueFull)
    assert (error.status, error.code) == (503, "queue_full")
    assert error.extra == {"queueDepth": 2, "avgWaitMs": 0}
    assert str(error).startswith("Queue depth 2/2, retry in ")
    assert int(error.headers["Retry-After"]) >= 1


def test_scheduler_retry_after_is_when_the_next_place_opens() -> None:
    """Retry-After is the time the request in flight has left at the measured service
    time (not the whole queue drained): shorter when requests are served faster."""

    def retry_after(service_s: float) -> int:
        d = Driver(one_slot(max_queue_depth=4, stats_window_s=60.0))
        current = d.arrive()
        for _ in range(4):
            d.arrive()
        for _ in range(4):
            d.now += service_s
            d.done(current)
            current = d.effects.granted_ids[-1]
            d.arrive()
        d.arrive()
        return int(d.effects.rejected[-1][1].headers["Retry-After"])

    fast, slow = retry_after(0.5), retry_after(5.0)
    assert (fast, slow) == (1, 5)  # the one just granted has its whole service time left


def test_scheduler_retry_after_spreads_clients_refused_together() -> None:
    """Clients refused one after another are sent back one service interval apart
    (x HEADROOM), so they do not all return into the same single place."""
    d = Driver(one_slot(max_queue_depth=1))
    first = d.arrive()
    d.arrive()
    d.now += 2.0
    d.done(first)  # measured: 2 s per request; the waiter now runs
    d.arrive()  # fills the queue again
    answers = []
    for _ in range(3):
        refused = d.arrive()
        answers.append(int(d.effects.rejection(refused).headers["Retry-After"]))
    assert answers == [2, 5, 8]  # 2 s left, then + 1.5 x 2 s for each one due back before


def test_scheduler_tenant_queue_cap_refuses_only_that_tenant() -> None:
    """A tenant at its queue cap is refused while other tenants can still queue."""
    d = Driver(one_slot(tenant_queue_caps={"noisy": 2}))
    d.arrive("other")
    d.arrive("noisy"), d.arrive("noisy")
    refused = d.arrive("noisy")
    quiet = d.arrive("quiet")
    error = d.effects.rejection(refused)
    assert isinstance(error, TenantQueueFull)
    assert (error.status, error.code) == (503, "tenant_queue_full")
    assert d.core.is_waiting(quiet)


def test_scheduler_queue_timeout_refuses_long_waiters() -> None:
    """A request waiting longer than the queue timeout is refused with queue_timeout."""
    d = Driver(one_slot(queue_timeout_s=30.0))
    busy = d.arrive()
    late = d.arrive()
    d.tick(29.9)
    assert d.effects.rejected == []
    d.tick(0.2)
    error = d.effects.rejection(late)
    assert isinstance(error, QueueTimeout)
    assert (error.status, error.code) == (503, "queue_timeout")
    d.done(busy)
    assert late not in d.effects.granted_ids


def test_scheduler_cancel_while_queued_is_never_granted() -> None:
    """A caller that leaves while queued is withdrawn and its turn goes to the next one."""
    d = Driver(one_slot())
    busy = d.arrive()
    leaver, stayer = d.arrive(), d.arrive()
    d.cancel(leaver)
    d.done(busy)
    assert d.effects.granted_ids == [busy, stayer]
    assert d.core.queue_depth() == 0


def test_scheduler_cancel_after_decision_releases_the_slot() -> None:
    """A grant refused by a caller that just left is not counted; the slot goes on."""
    d = Driver(one_slot())
    busy = d.arrive()
    leaver, stayer = d.arrive(), d.arrive()
    d.effects.gone.add(leaver)
    d.done(busy)
    assert d.effects.refused_grants == [leaver]
    assert d.effects.granted_ids == [busy, stayer]
    assert d.core.in_flight("m") == 1
    d.cancel(leaver)  # the cancel event arrives late: nothing happens
    d.done(leaver)  # nor does a stray ServeDone
    assert d.core.in_flight("m") == 1


def test_scheduler_serve_done_twice_counts_once() -> None:
    """A repeated ServeDone never drives the in-flight count below zero."""
    d = Driver(one_slot())
    t = d.arrive()
    d.done(t)
    d.done(t)
    assert d.core.in_flight("m") == 0


def test_scheduler_models_have_separate_slots() -> None:
    """Each model has its own concurrency cap; a full model does not block another."""
    d = Driver(SchedulerConfig(model_concurrency={"big": 1, "small": 2}))
    big = [d.arrive(model="big") for _ in range(2)]
    small = [d.arrive(model="small") for _ in range(2)]
    assert d.effects.granted_ids == [big[0], *small]
    d.done(small[0])
    assert d.core.is_waiting(big[1])


def test_scheduler_stats_report_recent_waits() -> None:
    """avgWaitMs and p95WaitMs come from the waits of granted requests."""
    d = Driver(one_slot(max_queue_depth=100, queue_timeout_s=None))
    current = d.arrive()
    for _ in range(20):
        d.arrive()
    for _ in range(20):
        d.now += 1.0
        d.done(current)
        current = d.effects.granted_ids[-1]
    stats = d.core.stats(d.now)
    assert stats.capabilities() == {
        "depth": 0,
        "running": 1,
        "maxDepth": 100,
        "avgWaitMs": round(1000 * sum(range(21)) / 21),
        "p95WaitMs": 19000,
        # one in flight, just granted, each served in 1 s: a new request waits 1 s; a low
        # one longer, as normal requests took 21 of the last 30 s of the slot
        "forecastWaitMs": {"high": 1000, "normal": 1000, "low": 3333},
        "forecastWaitMsByModel": {"m": {"high": 1000, "normal": 1000, "low": 3333}},
    }


def test_scheduler_shutdown_refuses_waiters_and_arrivals() -> None:
    """After shutdown every waiter and every new arrival is refused with shutting_down."""
    d = Driver(one_slot())
    d.arrive()
    waiter = d.arrive()
    d.core.handle(RunnerStopping(d.now))
    after = d.arrive()
    assert isinstance(d.effects.rejection(waiter), SchedulerStopped)
    assert isinstance(d.effects.rejection(after), SchedulerStopped)


def test_scheduler_unfair_mode_is_plain_arrival_order() -> None:
    """With fairness off, waiters in a band are served strictly in arrival order."""
    d = Driver(one_slot(fair=False))
    heavy = d.arrive("heavy", tokens=(1000, 1000))
    heavy_again = d.arrive("heavy")
    light = d.arrive("light")
    d.done(heavy)
    assert d.effects.granted_ids == [heavy, heavy_again]
    d.done(heavy_again)
    assert d.effects.granted_ids[-1] == light
