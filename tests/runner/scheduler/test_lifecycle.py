"""Model lifecycle in the scheduler core: loads, swaps, drains, keep-alive, crashes (pure)."""

from __future__ import annotations

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.errors import (
    ModelDoesNotFit,
    ModelFailed,
    ModelLoadFailed,
    ModelNotLoaded,
    ModelUnloading,
    QueueTimeout,
)
from runner.scheduler.models import ModelState
from tests.runner.scheduler.fakes import Driver

GB = 1000


def policy(mem_gb: int, **kwargs: object) -> ModelPolicy:
    return ModelPolicy(mem_gb * GB, **kwargs)  # type: ignore[arg-type]


def driver(capacity_gb: int = 20, **models: ModelPolicy) -> Driver:
    config = SchedulerConfig(
        models=models,
        unlisted_ready=False,
        queue_timeout_s=60.0,
        swap_max_wait_s=5.0,
        drain_timeout_s=30.0,
        max_queue_depth=100,
    )
    return Driver(config, capacity_mb=capacity_gb * GB)


def resident_with(
    d: Driver, model: str, mem_gb: int, concurrency: int = 1, load_s: float = 0.0
) -> None:
    """Load `model` through the scheduler, the load having started `load_s` ago; it is ready now."""
    now = d.now
    d.now = now - load_s
    d.load(model, d.core.config.models.get(model) or policy(mem_gb, concurrency=concurrency))
    d.now = now
    d.ready(model, mem_gb * GB, concurrency)


def test_lifecycle_load_with_free_memory_starts_at_once() -> None:
    """A governed load that fits starts loading at once; ready, it reports the measured memory."""
    d = driver()
    d.load("a", policy(8))
    assert d.effects.started == ["a"]
    assert d.state("a") == "loading" and list(d.resident()) == ["a"]
    assert d.effects.decisions == ["load a (8000 MB): 20000 MB free"]
    d.now = 4.0
    d.ready("a", 7500, concurrency=2)
    view = d.resident()["a"]
    assert (view.state, view.mem_mb, view.concurrency, view.since) == (
        ModelState.READY,
        7500,
        2,
        4.0,
    )


def test_lifecycle_load_reserves_memory_while_loading() -> None:
    """A second load that fits only without the first's reservation waits for eviction planning."""
    d = driver(capacity_gb=10, a=policy(8), b=policy(8))
    d.load("a", policy(8))
    d.load("b", policy(8))
    assert d.effects.started == ["a"]
    assert "b" in d.victims() and d.state("b") == "absent"  # a is loading, never a victim


def test_lifecycle_autoload_request_loads_and_is_granted_when_ready() -> None:
    """A request for an autoload model waits while it loads, then is granted with its wait."""
    d = driver(a=policy(8, autoload=True))
    ticket = d.arrive(model="a")
    assert d.effects.started == ["a"] and d.core.is_waiting(ticket)
    d.now = 12.5
    d.ready("a", 8 * GB)
    assert d.effects.granted == [(ticket, 12500)]


def test_lifecycle_request_for_a_model_not_loaded_is_404() -> None:
    """A request for a managed model that is neither loaded nor autoload gets model_not_loaded."""
    d = driver(g=policy(4))
    error = d.effects.rejection(d.arrive(model="g"))
    assert isinstance(error, ModelNotLoaded)
    assert (error.status, error.code) == (404, "model_not_loaded")
    unknown = d.effects.rejection(d.arrive(model="nobody-knows"))
    assert (unknown.status, unknown.code) == (404, "model_not_found")
    assert "models: g" in str(unknown)


def test_lifecycle_attached_models_stay_ready() -> None:
    """Models in model_concurrency are always ready and never loaded or evicted."""
    d = Driver(SchedulerConfig(model_concurrency={"attached": 1}, unlisted_ready=False))
    assert d.effects.granted_ids == [] and d.arrive(model="attached") in d.effects.granted_ids
    assert d.state("attached") == "ready"
    d.load("attached", policy(4))
    d.unload("attached")
    assert d.effects.started == [] and d.effects.stops == [] and d.state("attached") == "ready"


def test_lifecycle_evicts_the_least_recently_used_idle_model() -> None:
    """With memory full, the least recently used idle model is stopped, then the target loads."""
    d = driver()
    resident_with(d, "a", 10)
    d.now = 1.0
    resident_with(d, "b", 10)
    d.now = 2.0
    d.done(d.arrive(model="a"))  # a used after b
    d.load("c", policy(10))
    assert d.effects.stops == [["b"]]
    assert d.effects.started == ["a", "b"]  # c waits for b's memory
    assert (
        d.effects.decisions[-1] == "evict b (10000 MB) to load c (10000 MB); draining first: none"
    )
    d.stopped("b")
    assert d.effects.started == ["a", "b", "c"]


def test_lifecycle_pinned_model_is_never_evicted() -> None:
    """A pinned model stays even as the least recently used; the other model goes."""
    d = driver(pin=policy(10, pinned=True))
    resident_with(d, "pin", 10)
    d.now = 1.0
    resident_with(d, "b", 10)
    d.load("c", policy(10))
    assert d.effects.stopped == ["b"]


def test_lifecycle_busy_victim_is_drained_before_it_stops() -> None:
    """A victim with a request in flight is stopped only when it finishes; the load follows."""
    d = driver()
    resident_with(d, "a", 10)
    d.now = 1.0
    resident_with(d, "b", 10)
    d.now = 2.0
    busy = d.arrive(model="b")
    d.now = 3.0
    d.done(d.arrive(model="a"))  # b is now the least recently used, and busy
    d.load("c", policy(10), evict_first="b")
    assert d.effects.stops == [] and d.state("b") == "draining"
    d.now = 9.0
    d.done(busy)
    assert d.effects.stops == [["b"]] and d.effects.started == ["a", "b"]
    d.stopped("b")
    assert d.effects.started[-1] == "c"


def test_lifecycle_evict_model_is_honoured() -> None:
    """evictModel names the victim even when another model is less recently used."""
    d = driver()
    resident_with(d, "lru", 10)
    d.now = 1.0
    resident_with(d, "asked", 10)
    d.load("c", policy(10), evict_first="asked")
    assert d.effects.stopped == ["asked"]


def test_lifecycle_impossible_load_is_refused_with_the_reason() -> None:
    """A load that cannot fit even after evicting everything evictable is refused, saying why
    and when to retry (`Retry-After`: `failed_retry_after_s`)."""
    d = driver(pin=policy(10, pinned=True), big=policy(15, autoload=True))
    resident_with(d, "pin", 10)
    waiter = d.arrive(model="big")
    reason = (
        "needs 15000 MB; 10000 MB free, 0 MB evictable, 10000 MB pinned, "
        "0 MB loading, 0 MB being freed"
    )
    assert d.effects.refused_loads == [("big", f"does not fit: {reason}")]
    error = d.effects.rejection(waiter)
    assert isinstance(error, ModelDoesNotFit)
    assert (error.status, error.code, error.extra["reason"]) == (503, "model_does_not_fit", reason)
    assert error.headers["Retry-After"] == str(d.core.config.failed_retry_after_s)
    assert d.effects.stops == []


def test_lifecycle_victim_serves_its_waiters_before_the_swap() -> None:
    """A victim with requests waiting serves them first, then drains, then the target loads."""
    d = driver(a=policy(10, autoload=True), c=policy(10, autoload=True), b=policy(10))
    resident_with(d, "a", 10)
    resident_with(d, "b", 10)
    d.now = 1.0
    first = d.arrive(model="a")
    queued = [d.arrive(model="a") for _ in range(2)]
    target = d.arrive(model="c")  # b is idle: it goes, a keeps serving
    assert d.effects.stopped == ["b"]
    d.stopped("b")
    assert d.effects.started[-1] == "c"
    assert d.core.is_waiting(target)
    d.now = 2.0
    d.done(first)
    d.now = 3.0
    d.done(queued[0])
    assert d.effects.granted_ids[-2:] == queued


def test_lifecycle_batching_is_bounded_by_swap_max_wait() -> None:
    """A busy victim serves its waiters for at most swap_max_wait_s, then drains; the rest wait."""
    d = driver(a=policy(10, autoload=True), c=policy(20, autoload=True))
    resident_with(d, "a", 10, load_s=12.0)  # reloading it would cost more than the 5 s cap
    d.now = 1.0
    running = d.arrive(model="a")
    waiting = [d.arrive(model="a") for _ in range(4)]
    target = d.arrive(model="c")  # needs all 20 GB: a must go
    assert d.state("a") == "ready"  # still serving its batch
    current = running
    for at in (2.0, 4.0):
        d.now = at
        d.done(current)
        current = d.effects.granted_ids[-1]
    assert d.effects.granted_ids[-2:] == waiting[:2]
    d.tick(2.5)  # 6.5 s: the batch window (5 s from the decision at 1.0) is over
    assert d.state("a") == "draining"
    d.now = 7.0
    d.done(current)
    assert waiting[2] not in d.effects.granted_ids
    assert d.effects.stopped == ["a"]
    d.stopped("a")
    assert d.effects.started[-1] == "c"
    d.ready("c", 20 * GB)
    assert d.effects.granted_ids[-1] == target
    assert d.victims() == {"a": ("c",)}  # a's last two waiters want it back: c goes next


def test_lifecycle_batching_lasts_as_long_as_the_victims_reload() -> None:
    """A victim that reloads in less than swap_max_wait_s batches only that long."""
    d = driver(a=policy(10, autoload=True), c=policy(20, autoload=True))
    resident_with(d, "a", 10, load_s=3.0)
    assert d.resident()["a"].load_s == 3.0
    d.now = 1.0
    running = d.arrive(model="a")
    waiting = d.arrive(model="a")
    d.arrive(model="c")
    d.tick(2.9)
    assert d.state("a") == "ready"
    d.tick(0.1)  # 3 s after the decision: a reload of a would have taken that long
    assert d.state("a") == "draining"
    d.done(running)
    assert waiting not in d.effects.granted_ids and d.effects.stopped == ["a"]


def test_lifecycle_cold_load_counts_against_the_queue_timeout() -> None:
    """A request that made its model load times out if the load outlasts the queue timeout."""
    d = driver(a=policy(8, autoload=True))
    ticket = d.arrive(model="a")
    d.tick(61.0)
    assert isinstance(d.effects.rejection(ticket), QueueTimeout)


def test_lifecycle_keep_alive_unloads_an_idle_model() -> None:
    """A ready model idle past keep_alive_s is stopped on a tick; pinned and busy ones stay."""
    d = driver(
        k=policy(4, keep_alive_s=60.0),
        busy=policy(4, keep_alive_s=60.0),
        pin=policy(4, keep_alive_s=60.0, pinned=True),
    )
    for model in ("k", "busy", "pin"):
        resident_with(d, model, 4)
    d.now = 30.0
    running = d.arrive(model="busy")
    d.tick(29.0)
    assert d.effects.stops == []
    d.tick(1.0)
    assert d.effects.stops == [["k"]]
    d.tick(100.0)
    assert d.effects.stopped == ["k"]
    d.done(running)
    d.tick(60.0)
    assert d.effects.stopped == ["k", "busy"]


def test_lifecycle_unload_drains_in_flight_and_refuses_the_queue() -> None:
    """Unload: queued requests are refused at once, in-flight ones finish, then it stops."""
    d = driver()
    resident_with(d, "a", 8)
    running = d.arrive(model="a")
    queued = d.arrive(model="a")
    d.unload("a")
    error = d.effects.rejection(queued)
    assert isinstance(error, ModelUnloading)
    assert (error.status, error.code) == (503, "model_unloading")
    assert isinstance(d.effects.rejection(d.arrive(model="a")), ModelUnloading)
    assert d.effects.stops == [] and running not in [t for t, _ in d.effects.rejected]
    d.done(running)
    assert d.effects.stops == [["a"]] and d.effects.cuts == {}
    d.stopped("a")
    assert d.state("a") == "absent" and d.resident() == {}


def test_lifecycle_unload_drain_is_bounded() -> None:
    """A drain that outlasts drain_timeout_s is stopped anyway, and the requests still in
    flight are to be answered 503 model_unloading naming the unload and the timeout."""
    d = driver()
    resident_with(d, "a", 8)
    d.arrive(model="a")
    d.unload("a")
    d.tick(29.0)
    assert d.effects.stops == []
    d.tick(1.0)
    assert d.effects.stops == [["a"]]
    assert d.effects.decisions[-1] == "stop a: drain timeout, 1 still in flight"
    cut = d.effects.cuts["a"]
    assert isinstance(cut, ModelUnloading) and (cut.status, cut.code) == (503, "model_unloading")
    assert "unloaded" in str(cut) and "drain timeout (30 s)" in str(cut), str(cut)
    assert "Retry-After" not in cut.headers


def test_lifecycle_evicted_drain_timeout_cut_names_the_model_loaded_instead() -> None:
    """A victim of a swap stopped at its drain timeout (its own `drain_timeout_s`) cuts its
    requests in flight with 503 model_unloading naming the model it made room for."""
    d = driver(capacity_gb=10, b=policy(10, drain_timeout_s=2.0))
    resident_with(d, "b", 10)
    d.arrive(model="b")
    d.load("c", policy(10))
    assert d.state("b") == "draining"
    d.tick(2.0)
    assert d.effects.stopped == ["b"]
    cut = d.effects.cuts["b"]
    assert isinstance(cut, ModelUnloading)
    assert "evicted to load 'c'" in str(cut) and "drain timeout (2 s)" in str(cut), str(cut)


def test_lifecycle_crash_refuses_the_waiters_with_503_and_retry_after() -> None:
    """An engine crash (no restart) fails the model with its reason and exit code, and
    refuses the requests waiting for it with 503 model_unavailable and Retry-After."""
    d = driver()
    resident_with(d, "a", 8)
    d.arrive(model="a")
    waiter = d.arrive(model="a")
    d.crashed("a", "engine exited (killed by SIGKILL)", exit_code=-9)
    error = d.effects.rejection(waiter)
    assert isinstance(error, ModelFailed)
    assert (error.status, error.code) == (503, "model_unavailable")
    assert error.extra["reason"] == "engine exited (killed by SIGKILL)"
    assert error.headers["Retry-After"] == "30"
    view = d.core.models()["a"]
    assert (view.state, view.reason, view.exit_code) == (
        ModelState.FAILED,
        "engine exited (killed by SIGKILL)",
        -9,
    )
    assert isinstance(d.effects.rejection(d.arrive(model="a")), ModelFailed)


def test_lifecycle_restart_policy_keeps_waiters_waiting() -> None:
    """With restart, a crash keeps the waiters queued; after the backoff the engine is
    started again and serves them."""
    d = driver(a=policy(8, restart=True))
    resident_with(d, "a", 8)
    running = d.arrive(model="a")
    waiter = d.arrive(model="a")
    d.crashed("a")
    assert d.core.is_waiting(waiter) and d.state("a") == "failed"
    assert d.effects.started == ["a"]  # not yet: the first restart waits 1 s
    d.tick(1.0)
    assert d.state("a") == "loading" and d.effects.started == ["a", "a"]
    d.done(running)  # the request the crash cut short ends
    d.ready("a", 8 * GB)
    assert d.effects.granted_ids[-1] == waiter


def test_lifecycle_crash_loop_ends_failed_with_the_reason() -> None:
    """A model that crashes `max_restarts` times in a row, each soon after it came back,
    stays failed, saying so; its waiters are refused."""
    d = driver(a=policy(8, restart=True))
    resident_with(d, "a", 8)
    for attempt, backoff in enumerate((1.0, 2.0, 4.0, 8.0, 16.0)):
        d.crashed("a", "engine exited (exit code 1)")
        assert d.state("a") == "failed", attempt
        d.tick(backoff)
        assert d.state("a") == "loading", attempt
        d.ready("a", 8 * GB)
    d.arrive(model="a")  # in flight
    waiter = d.arrive(model="a")
    d.crashed("a", "engine exited (exit code 1)")
    view = d.core.models()["a"]
    assert view.state is ModelState.FAILED and view.restart_at is None
    assert view.reason == "engine exited (exit code 1); not restarted after 6 crashes in a row"
    assert isinstance(d.effects.rejection(waiter), ModelFailed)
    d.tick(60.0)
    assert d.state("a") == "failed"


def test_lifecycle_load_failure_rejects_the_waiters() -> None:
    """A failed load refuses its waiters with model_load_failed and frees its reservation."""
    d = driver(capacity_gb=10, a=policy(8, autoload=True), b=policy(8, autoload=True))
    waiter = d.arrive(model="a")
    other = d.arrive(model="b")  # waits for a's reservation
    d.failed("a", "file not found")
    error = d.effects.rejection(waiter)
    assert isinstance(error, ModelLoadFailed)
    assert (error.code, error.extra["reason"]) == ("model_load_failed", "file not found")
    assert d.effects.started == ["a", "b"] and d.core.is_waiting(other)


def test_lifecycle_load_of_a_loading_model_joins_it() -> None:
    """Asking again for a model already loading starts nothing new."""
    d = driver()
    d.load("a", policy(8))
    d.load("a", policy(8))
    assert d.effects.started == ["a"]


def test_lifecycle_unexpected_stop_rejects_waiters() -> None:
    """An engine that stops unasked fails the model: its waiters are refused, nothing
    restarts it."""
    d = driver(a=policy(8, restart=True))
    resident_with(d, "a", 8)
    d.arrive(model="a")
    waiter = d.arrive(model="a")
    d.stopped("a")
    assert isinstance(d.effects.rejection(waiter), ModelFailed)
    assert d.state("a") == "failed"
    d.tick(60.0)
    assert d.state("a") == "failed" and d.effects.started == ["a"]


def test_lifecycle_high_band_load_is_planned_first() -> None:
    """Of two models waiting for memory, the one a high-priority request waits for loads first."""
    d = driver(
        capacity_gb=10,
        a=policy(10, autoload=True),
        n=policy(10, autoload=True),
        h=policy(10, autoload=True),
    )
    d.arrive(model="a")
    d.ready("a", 10 * GB)
    d.done(1)
    d.arrive(model="n")
    d.arrive(model="h", priority="high")
    assert d.victims() == {"n": ("a",), "h": ()}  # n's swap was committed first
    d.stopped("a")
    d.ready("n", 10 * GB)
    d.done(d.effects.granted_ids[-1])
    assert d.victims() == {"h": ("n",)}


def test_lifecycle_resident_reports_use() -> None:
    """A model's view gives its state, memory, in-flight, waiting and last use."""
    d = driver(a=policy(8, keep_alive_s=100.0))
    resident_with(d, "a", 8)
    d.now = 5.0
    d.arrive(model="a")
    d.arrive(model="a")
    view = d.resident()["a"]
    assert (view.in_flight, view.waiting, view.last_used) == (1, 1, 5.0)
    assert view.keep_alive_until == 105.0 and view.evicting_for is None
