"""Hypothesis state machine: every request ends exactly once and slots never leak."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runner.scheduler.config import SchedulerConfig
from runner.scheduler.errors import QueueTimeout
from tests.runner.scheduler.fakes import Driver

CONFIG = SchedulerConfig(
    max_queue_depth=5,
    queue_timeout_s=30.0,
    model_concurrency={"m1": 1, "m2": 2},
    tenant_queue_caps={"c": 2},
    low_aging_s=10.0,
)


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals, completions, disconnects, cancels and time against the core."""

    def __init__(self) -> None:
        super().__init__()
        self.d = Driver(CONFIG)
        self.model_of: dict[int, str] = {}
        self.cancelled_in_queue: set[int] = set()
        self.done_ids: set[int] = set()

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

    # -- rules ------------------------------------------------------------------

    @rule(
        tenant=st.sampled_from(["a", "b", "c"]),
        priority=st.sampled_from(["high", "normal", "low"]),
        model=st.sampled_from(["m1", "m2"]),
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
        for model in ("m1", "m2"):
            live = sum(1 for t in self.serving() if self.model_of[t] == model)
            assert 0 <= self.d.core.in_flight(model) == live <= CONFIG.concurrency(model)

    @invariant()
    def nobody_waits_beside_a_free_slot(self) -> None:
        for ticket_id in self.undecided():
            model = self.model_of[ticket_id]
            assert self.d.core.in_flight(model) == CONFIG.concurrency(model)

    def teardown(self) -> None:
        """Finish everything: each request then has exactly one ending, and nothing leaks."""
        while self.serving():
            for ticket_id in sorted(self.serving()):
                self.done_ids.add(ticket_id)
                self.d.done(ticket_id)
        self.d.tick(CONFIG.queue_timeout_s or 0.0)
        for ticket_id in self.model_of:
            ends = self.endings(ticket_id)
            assert len(ends) == 1, (ticket_id, ends)
            if ends == ["rejected:queue_timeout"]:
                assert isinstance(self.d.effects.rejection(ticket_id), QueueTimeout)
        assert self.d.core.queue_depth() == 0
        assert self.d.core.in_flight("m1") == self.d.core.in_flight("m2") == 0


SchedulerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None
)
test_scheduler_machine_every_request_ends_once = SchedulerMachine.TestCase
