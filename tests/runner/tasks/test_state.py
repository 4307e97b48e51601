"""The load task's status enum and its transition table."""

from __future__ import annotations

import pytest

from runner.tasks.errors import IllegalTaskTransition, TaskNotCancellable
from runner.tasks.state import (
    ACTIVE,
    TERMINAL,
    TaskStatus,
    assert_transition,
    can_transition,
    may_overwrite,
    statuses_that_may_become,
)

Q, D, L = TaskStatus.QUEUED, TaskStatus.DOWNLOADING, TaskStatus.LOADING
C, F, X = TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED

EXPECTED = {
    Q: {D, L, F, X},
    D: {L, F, X},
    L: {C, F, X},
    C: set(),
    F: set(),
    X: set(),
}


def test_state_values_are_the_wire_names() -> None:
    """The enum values are exactly the statuses GET /v1/models/load/{taskId} reports."""
    assert [s.value for s in TaskStatus] == [
        "queued",
        "downloading",
        "loading",
        "completed",
        "failed",
        "cancelled",
    ]


@pytest.mark.parametrize("current", list(TaskStatus))
@pytest.mark.parametrize("target", list(TaskStatus))
def test_state_table_allows_exactly_the_documented_moves(
    current: TaskStatus, target: TaskStatus
) -> None:
    """can_transition is true for exactly the moves the lifecycle lists, and no others."""
    assert can_transition(current, target) is (target in EXPECTED[current])


def test_state_terminal_and_active_partition_the_statuses() -> None:
    """completed/failed/cancelled are terminal, the rest active, and nothing is both."""
    assert frozenset({C, F, X}) == TERMINAL
    assert frozenset({Q, D, L}) == ACTIVE
    assert all(s.terminal != s.active for s in TaskStatus)


@pytest.mark.parametrize("current", [C, F, X])
@pytest.mark.parametrize("target", [Q, D, L, C, F])
def test_state_terminal_never_moves(current: TaskStatus, target: TaskStatus) -> None:
    """A terminal task refuses every move with IllegalTaskTransition (internal, 500)."""
    with pytest.raises(IllegalTaskTransition) as info:
        assert_transition("load-x", current, target)
    assert info.value.status == 500
    assert not isinstance(info.value, TaskNotCancellable)


@pytest.mark.parametrize("current", [C, F, X])
def test_state_cancel_of_finished_task_is_not_cancellable(current: TaskStatus) -> None:
    """Cancelling a finished task raises the client-facing 409 task_not_cancellable."""
    with pytest.raises(TaskNotCancellable) as info:
        assert_transition("load-x", current, X)
    assert (info.value.status, info.value.code) == (409, "task_not_cancellable")
    assert info.value.extra == {"taskId": "load-x", "status": current.value}


def test_state_backwards_move_is_illegal() -> None:
    """loading -> downloading is refused; the message names both statuses."""
    with pytest.raises(IllegalTaskTransition, match="'loading' to 'downloading'"):
        assert_transition("load-x", L, D)


def test_state_may_overwrite_same_status_or_reachable_status() -> None:
    """A store accepts a progress update (same status) or a status legal moves lead to."""
    assert may_overwrite(L, L)
    assert may_overwrite(Q, L)
    assert may_overwrite(Q, C)
    assert may_overwrite(D, C)
    assert not may_overwrite(C, F)
    assert not may_overwrite(X, L)
    assert not may_overwrite(L, D)
    assert statuses_that_may_become(L) == frozenset({Q, D, L})
    assert statuses_that_may_become(X) == frozenset({Q, D, L, X})
    assert statuses_that_may_become(C) == frozenset({Q, D, L, C})
