"""What a request meets in each model state (`models.admission`), what may be unloaded
(`models.unload_refusal`), and the state table's guarded moves: pure, no scheduler."""

from __future__ import annotations

import pytest

from faults import QuorumError
from runner.scheduler.config import ModelPolicy
from runner.scheduler.models import (
    Gate,
    IllegalModelTransition,
    ModelRecord,
    ModelState,
    admission,
    unload_refusal,
)

pytestmark = pytest.mark.timeout(10)


def record(state: ModelState, **kw: object) -> ModelRecord:
    autoload = bool(kw.pop("autoload", False))
    sleep_refusal = kw.pop("sleep_refusal", None)
    policy = ModelPolicy(100, autoload=autoload, sleep_refusal=sleep_refusal)  # type: ignore[arg-type]
    r = ModelRecord(policy, state)
    for key, value in kw.items():
        setattr(r, key, value)
    return r


@pytest.mark.parametrize(
    ("case", "rec", "wanted", "expected"),
    [
        ("unknown", None, False, (404, "model_not_found")),
        ("absent", record(ModelState.ABSENT), False, (404, "model_not_loaded")),
        ("absent, autoload", record(ModelState.ABSENT, autoload=True), False, Gate.AUTOLOAD),
        ("wanted", record(ModelState.ABSENT), True, Gate.QUEUE),
        ("loading", record(ModelState.LOADING), False, Gate.QUEUE),
        ("ready", record(ModelState.READY), False, Gate.OPEN),
        ("ready victim", record(ModelState.READY, evict_for="b"), False, Gate.OPEN),
        (
            "draining, unload",
            record(ModelState.DRAINING, unloading=True, autoload=True),
            False,
            (503, "model_unloading"),
        ),
        ("draining, evicted", record(ModelState.DRAINING), False, (503, "model_unloading")),
        (
            "draining, evicted autoload",
            record(ModelState.DRAINING, autoload=True),
            False,
            Gate.QUEUE,
        ),
        ("stopping", record(ModelState.STOPPING), False, (503, "model_unloading")),
        ("failed", record(ModelState.FAILED, reason="died"), False, (503, "model_unavailable")),
        ("failed, restart due", record(ModelState.FAILED, restart_at=5.0), False, Gate.QUEUE),
        ("failed, autoload", record(ModelState.FAILED, autoload=True), False, Gate.AUTOLOAD),
        ("sleeping", record(ModelState.SLEEPING), False, (404, "model_not_loaded")),
    ],
)
def test_models_admission_per_state(
    case: str, rec: ModelRecord | None, wanted: bool, expected: object
) -> None:
    """Each state gives the gate, or the exact status and code, docs/api.md lists."""
    got = admission("m", rec, wanted, ["m", "other"], 30)
    if isinstance(expected, Gate):
        assert got is expected, case
    else:
        assert isinstance(got, QuorumError), case
        assert (got.status, got.code) == expected, case


def test_models_failed_refusal_carries_reason_and_retry_after() -> None:
    """A failed model's refusal names the reason and says when to retry."""
    got = admission("m", record(ModelState.FAILED, reason="engine exited (SIGKILL)"), False, [], 7)
    assert isinstance(got, QuorumError)
    assert got.extra == {"model": "m", "reason": "engine exited (SIGKILL)"}
    assert got.headers == {"Retry-After": "7"}


@pytest.mark.parametrize(
    ("rec", "mode", "expected"),
    [
        (None, "stop", (404, "model_not_found")),
        (record(ModelState.READY), "stop", None),
        (record(ModelState.FAILED), "stop", None),
        (record(ModelState.SLEEPING), "stop", None),
        (record(ModelState.ABSENT), "stop", (404, "model_not_loaded")),
        (record(ModelState.LOADING), "stop", (404, "model_not_loaded")),
        (record(ModelState.READY, unloading=True), "stop", (404, "model_not_loaded")),
        (record(ModelState.READY, sleep_refusal="cannot"), "sleep", (400, "invalid_request")),
        (record(ModelState.READY), "sleep", None),
        (record(ModelState.SLEEPING), "sleep", (404, "model_not_loaded")),
    ],
)
def test_models_unload_refusal(rec: ModelRecord | None, mode: str, expected: object) -> None:
    """Only a model holding an engine can be unloaded; only one that can sleep, asleep."""
    got = unload_refusal("m", rec, mode)
    if expected is None:
        assert got is None
    else:
        assert got is not None and (got.status, got.code) == expected


def test_models_state_moves_are_guarded() -> None:
    """A move the table forbids is a bug, raised at once."""
    r = record(ModelState.ABSENT)
    r.move("m", ModelState.LOADING, 1.0)
    assert (r.state, r.since) == (ModelState.LOADING, 1.0)
    with pytest.raises(IllegalModelTransition):
        r.move("m", ModelState.SLEEPING, 2.0)
