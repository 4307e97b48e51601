"""Hypothesis state machine: every request ends exactly once and slots never leak.

Attached models (m1, m2) and managed ones (a1, a2 load on demand, a2 restarts
after a crash; g only by a governed load) share 10 GB that a1 and a2 cannot
both hold, with loads, readiness, failures, unloads, stops and crashes
interleaved with the requests. a1 and g run on one engine process (slot group
`shared`): they share its one slot.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runner.scheduler.config import ModelPolicy, SchedulerConfig
from runner.scheduler.errors import QueueTimeout
from runner.scheduler.models import ModelState
from tests.runner.scheduler.fakes import Driver

POLICIES = {
    "a1": ModelPolicy(6000, concurrency=1, autoload=True, slot_group="shared"),
    "a2": ModelPolicy(6000, concurrency=2, autoload=True, restart=True),
    "g": ModelPolicy(4000, concurrency=1, slot_group="shared"),
}
CAPACITY_MB = 10_000
CONFIG = SchedulerConfig(
    max_queue_depth=5,
    queue_timeout_s=30.0,
    model_concurrency={"m1": 1, "m2": 2},
    tenant_queue_caps={"c": 2},
    low_aging_s=10.0,
    models=POLICIES,
    unlisted_ready=False,
    swap_max_wait_s=5.0,
    drain_timeout_s=20.0,
)
MODELS = ["m1", "m2", "a1", "a2", "g"]


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals, completions, disconnects, cancels and time against the core."""

    def __init__(self) -> None:
        super().__init__()
        self.d = Driver(CONFIG, capacity_mb=CAPACITY_MB)
        self.model_of: dict[int, str] = {}
        self.cancelled_in_queue: set[int] = set()
        self.done_ids: set[int] = set()
        self.stops_seen = 0

    # -- what the fake effects and the test saw happen to each request ----------

    def endings(self, ticket_id: int) -> list[str]:
        fx = self.d.effects
        ends = [f"rejected:{err.code}" for tid, err in fx.rejected if tid == ticket_id]
        ends += ["cancelled" for tid in fx.refused_grants if tid == ticket_id]
        ends += ["cancelled" for tid in self.cancelled_in_queue if tid == ticket_id]
        ends += ["granted" for tid in fx.granted_ids if tid == ticket_id]
        return ends

    def serving(self) -> set[int]:
        return set(self.d.effects.granted_ids) - self.done_ids

    def undecided(self) -> list[int]:
        return [t for t in self.model_of if not self.endings(t)]

    def in_phase(self, phase: ModelState) -> list[str]:
        return sorted(m for m, view in self.d.resident().items() if view.state is phase)

    def concurrency(self, model: str) -> int:
        view = self.d.resident().get(model)
        return CONFIG.concurrency(model) if view is None else view.concurrency

    # -- rules ------------------------------------------------------------------

    @rule(
        tenant=st.sampled_from(["a", "b", "c"]),
        priority=st.sampled_from(["high", "normal", "low"]),
        model=st.sampled_from(MODELS),
        tokens=st.tuples(st.integers(0, 500), st.integers(0, 500)),
    )
    def arrive(self, tenant: str, priority: str, model: str, tokens: tuple[int, int]) -> None:
        ticket_id = self.d.arrive(tenant, priority=priority, model=model, tokens=tokens)
        self.model_of[ticket_id] = model

    @precondition(lambda self: bool(self.serving()))
    @rule(data=st.data(), usage=st.none() | st.tuples(st.integers(0, 500), st.integers(0, 500)))
    def finish(self, data: st.DataObject, usage: tuple[int, int] | None) -> None:
        ticket_id = data.draw(st.sampled_from(sorted(self.serving())))
        self.done_ids.add(ticket_id)
        self.d.done(ticket_id, usage)

    @precondition(lambda self: bool(self.model_of))
    @rule(data=st.data())
    def stray_serve_done(self, data: st.DataObject) -> None:
        ticket_id = data.draw(st.sampled_from(sorted(self.model_of)))
        if ticket_id not in self.serving():
            self.d.done(ticket_id)

    @precondition(lambda self: bool(self.undecided()))
    @rule(data=st.data())
    def caller_leaves(self, data: st.DataObject) -> None:
        """The client disconnects; its cancel event has not reached the scheduler yet."""
        self.d.effects.gone.add(data.draw(st.sampled_from(self.undecided())))

    @precondition(lambda self: bool(self.model_of))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        ticket_id = data.draw(st.sampled_from(sorted(self.model_of)))
        if self.d.core.is_waiting(ticket_id):
            self.cancelled_in_queue.add(ticket_id)
            self.d.effects.gone.add(ticket_id)
        self.d.cancel(ticket_id)

    @rule(seconds=st.floats(0, 40))
    def tick(self, seconds: float) -> None:
        self.d.tick(seconds)

    @rule(model=st.sampled_from(sorted(POLICIES)), first=st.none() | st.sampled_from(MODELS))
    def load(self, model: str, first: str | None) -> None:
        self.d.load(model, POLICIES[model], first)

    @rule(model=st.sampled_from(sorted(POLICIES)))
    def unload(self, model: str) -> None:
        self.d.unload(model)

    @precondition(lambda self: bool(self.in_phase(ModelState.LOADING)))
    @rule(data=st.data(), fails=st.booleans())
    def pool_answers_load(self, data: st.DataObject, fails: bool) -> None:
        model = data.draw(st.sampled_from(self.in_phase(ModelState.LOADING)))
        if fails:
            self.d.failed(model)
        else:
            self.d.ready(model, POLICIES[model].mem_mb, POLICIES[model].concurrency)

    @precondition(lambda self: bool(self.in_phase(ModelState.STOPPING)))
    @rule(data=st.data())
    def pool_stops(self, data: st.DataObject) -> None:
        self.d.stopped(data.draw(st.sampled_from(self.in_phase(ModelState.STOPPING))))

    @precondition(lambda self: bool(self.d.resident()))
    @rule(data=st.data())
    def engine_crashes(self, data: st.DataObject) -> None:
        self.d.crashed(data.draw(st.sampled_from(sorted(self.d.resident()))))

    # -- invariants -------------------------------------------------------------

    @invariant()
    def each_request_ends_at_most_once(self) -> None:
        for ticket_id in self.model_of:
            assert len(self.endings(ticket_id)) <= 1, (ticket_id, self.endings(ticket_id))

    @invariant()
    def undecided_requests_are_waiting(self) -> None:
        undecided = self.undecided()
        assert all(self.d.core.is_waiting(t) for t in undecided)
        assert self.d.core.queue_depth() == len(undecided) <= CONFIG.max_queue_depth

    @invariant()
    def in_flight_matches_live_grants(self) -> None:
        for model in MODELS:
            live = sum(1 for t in self.serving() if self.model_of[t] == model)
            assert 0 <= self.d.core.in_flight(model) == live
            if model in CONFIG.model_concurrency:
                assert live <= CONFIG.concurrency(model)

    @invariant()
    def nobody_waits_beside_a_free_slot(self) -> None:
        for ticket_id in self.undecided():
            model = self.model_of[ticket_id]
            if self.d.state(model) == "ready":
                slots = self.d.core.slots
                own_full = self.d.core.in_flight(model) >= self.concurrency(model)
                assert own_full or slots.group_in_flight(model) >= slots.capacity(model)

    @invariant()
    def a_slot_group_never_holds_more_than_its_slots(self) -> None:
        live = sum(1 for t in self.serving() if self.model_of[t] in ("a1", "g"))
        assert live <= min(POLICIES["a1"].concurrency, POLICIES["g"].concurrency)

    @invariant()
    def memory_is_never_overcommitted(self) -> None:
        held = sum(view.mem_mb for view in self.d.resident().values())
        assert held <= CAPACITY_MB

    @invariant()
    def stopped_models_wait_for_the_pool(self) -> None:
        """Every model named by the last step's `stop_models` is stopping (nothing else)."""
        for call in self.d.effects.stops[self.stops_seen :]:
            assert all(self.d.state(model) == "stopping" for model in call)
        self.stops_seen = len(self.d.effects.stops)

    def settle(self) -> None:
        """Finish what is served, answer every load and stop, let time pass; until quiet."""
        for _ in range(100):
            before = (len(self.d.effects.granted), len(self.d.effects.rejected))
            for ticket_id in sorted(self.serving()):
                self.done_ids.add(ticket_id)
                self.d.done(ticket_id)
            for model in self.in_phase(ModelState.LOADING):
                self.d.ready(model, POLICIES[model].mem_mb, POLICIES[model].concurrency)
            for model in self.in_phase(ModelState.STOPPING):
                self.d.stopped(model)
            self.d.tick(1.0)
            after = (len(self.d.effects.granted), len(self.d.effects.rejected))
            busy = (
                self.serving()
                or self.in_phase(ModelState.LOADING)
                or self.in_phase(ModelState.STOPPING)
            )
            if after == before and not busy:
                return

    def teardown(self) -> None:
        """Finish everything: each request then has exactly one ending, and nothing leaks."""
        self.settle()
        self.d.tick(CONFIG.queue_timeout_s or 0.0)
        self.settle()
        for ticket_id in self.model_of:
            ends = self.endings(ticket_id)
            assert len(ends) == 1, (ticket_id, ends)
            if ends == ["rejected:queue_timeout"]:
                assert isinstance(self.d.effects.rejection(ticket_id), QueueTimeout)
        assert self.d.core.queue_depth() == 0
        assert all(self.d.core.in_flight(model) == 0 for model in MODELS)


SchedulerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
test_scheduler_machine_every_request_ends_once = SchedulerMachine.TestCase
