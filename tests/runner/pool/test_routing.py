"""runner.pool.routing and sizing.policy_for: what a request, an unload and the scheduler
may do with a model, decided from its slot alone; waiters settled all at once."""

from __future__ import annotations

from typing import Any

import pytest

from runner.errors import BadRequest, ModelNotFound
from runner.models_config import ModelSpec
from runner.pool import routing
from runner.pool.errors import ModelUnavailable, WrongEndpoint
from runner.pool.launch import Launched
from runner.pool.sizing import policy_for
from runner.pool.slot import ModelSlot
from runner.pool.states import ModelState
from runner.pool.waiters import Waiters
from runner.scheduler.errors import ModelNotLoaded

pytestmark = pytest.mark.timeout(10)


def _slots(state: ModelState, backend: str = "llama-server", **spec: Any) -> dict[str, ModelSlot]:
    slot = ModelSlot(ModelSpec(id="m", backend=backend, **spec), state=state)
    if state in (ModelState.READY, ModelState.FAILED, ModelState.SLEEPING):
        slot.launched = Launched(engine=object(), process=None)  # type: ignore[arg-type]
    return {"m": slot}


def test_unknown_model_is_404_listing_the_models() -> None:
    with pytest.raises(ModelNotFound, match="models: m"):
        routing.route_missing(_slots(ModelState.UNLOADED), "other")


@pytest.mark.parametrize(
    ("state", "autoload", "error"),
    [
        (ModelState.LOADING, False, None),  # waits in the queue for the engine
        (ModelState.UNLOADED, True, None),  # the scheduler loads it
        (ModelState.UNLOADED, False, ModelNotLoaded),
        (ModelState.FAILED, False, ModelUnavailable),
        (ModelState.FAILED, True, None),  # autoload tries again
        (ModelState.DRAINING, False, ModelUnavailable),
        (ModelState.STOPPING, True, ModelUnavailable),
    ],
)
def test_a_model_without_engine_waits_or_gets_the_right_error(
    state: ModelState, autoload: bool, error: type[Exception] | None
) -> None:
    slots = _slots(state, autoload=autoload)
    if error is None:
        routing.route_missing(slots, "m")
    else:
        with pytest.raises(error):
            routing.route_missing(slots, "m")


def test_speech_model_on_the_data_path_is_400_naming_the_audio_path() -> None:
    slots = _slots(ModelState.READY, backend="faster-whisper", path="/w")
    with pytest.raises(WrongEndpoint, match="audio/transcriptions"):
        routing.check_endpoint(slots, "m", speech=False)
    routing.check_endpoint(slots, "m", speech=True)
    with pytest.raises(WrongEndpoint, match="not a speech model"):
        routing.check_endpoint(_slots(ModelState.READY), "m", speech=True)


def test_unloadable_only_with_an_engine_and_sleep_only_for_a_ready_vllm() -> None:
    routing.check_unloadable(_slots(ModelState.FAILED), "m", "stop", sleep_enabled=False)
    with pytest.raises(ModelNotLoaded):
        routing.check_unloadable(_slots(ModelState.UNLOADED), "m", "stop", sleep_enabled=True)
    with pytest.raises(BadRequest, match="vLLM"):
        routing.check_unloadable(_slots(ModelState.READY), "m", "sleep", sleep_enabled=True)
    vllm = _slots(ModelState.READY, backend="vllm", hf="org/model")
    with pytest.raises(BadRequest, match="VLLM_ENABLE_SLEEP_MODE"):
        routing.check_unloadable(vllm, "m", "sleep", sleep_enabled=False)
    routing.check_unloadable(vllm, "m", "sleep", sleep_enabled=True)
    with pytest.raises(ModelNotFound):
        routing.check_unloadable(vllm, "x", "stop", sleep_enabled=True)


def test_policy_attached_engine_is_pinned_and_holds_no_memory() -> None:
    spec = ModelSpec(id="a", backend="openai", url="http://127.0.0.1:1", parallel=3)
    policy = policy_for(spec, None, 80_000, 0.9)
    assert (policy.mem_mb, policy.pinned, policy.concurrency) == (0, True, 3)


def test_policy_vllm_reserves_its_gpu_share_unless_a_budget_is_given() -> None:
    spec = ModelSpec(id="v", backend="vllm", hf="org/model")
    assert policy_for(spec, None, 80_000, 0.5).mem_mb == 40_000
    assert policy_for(spec, 12_000, 80_000, 0.5).mem_mb == 12_000


async def test_waiters_all_get_the_outcome_and_a_gone_caller_is_skipped() -> None:
    waiters: Waiters[int] = Waiters()
    first, second, gone = waiters.add("m"), waiters.add("m"), waiters.add("m")
    gone.cancel()
    waiters.settle("m", 7)
    assert (await first, await second) == (7, 7)
    failing = waiters.add("m")  # a new waiter waits for the next outcome
    waiters.settle("m", ModelUnavailable("load cancelled"))
    with pytest.raises(ModelUnavailable):
        await failing
    waiters.settle("m", 8)  # nobody waits: nothing happens
