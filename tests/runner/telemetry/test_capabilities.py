"""The `/v1/capabilities` document as a pure function of the scheduler's models, the
pool's engine facts, the queue and the engines' last figures (runner/telemetry/capabilities.py)."""

from __future__ import annotations

from typing import Any

from adapters.features import Features
from adapters.kind import EngineSettings
from adapters.launched import EngineLoad
from adapters.llama_server.engine import LLAMA_SERVER_VERSION
from runner.engines.kinds import EngineKinds
from runner.engines.record import EngineRecord
from runner.floor.models_file import ModelSpec
from runner.scheduler.models import ModelState, ModelView
from runner.telemetry.capabilities import capabilities, kv_utilization, runner_type

QUEUE = {"depth": 2, "running": 4, "maxDepth": 16, "avgWaitMs": 10, "p95WaitMs": 20}


Slot = tuple[ModelView, EngineRecord]


def _slot(model: str, backend: Any, state: ModelState, **spec: Any) -> Slot:
    """A model as the scheduler sees it (its state) with its engine facts (the pool's)."""
    if backend == "comfyui":
        spec.setdefault("checkpoint", "x.safetensors")
    view = ModelView(model, state, 0, 1, 0, 0, 0.0, 0.0, False, 0, None, None, None)
    return view, EngineRecord(ModelSpec(id=model, backend=backend, **spec))


def _doc(slots: list[Slot], **kw: Any) -> dict[str, Any]:
    views = {view.model: view for view, _ in slots}
    records = {view.model: record for view, record in slots}
    specs = {view.model: record.spec for view, record in slots}
    caching = "true" if kw.pop("caching", True) else "false"
    kinds = EngineKinds(EngineSettings(environ={"VLLM_ENABLE_PREFIX_CACHING": caching}))

    def features(spec: ModelSpec) -> Features:
        return kinds.of(spec).features(kinds.engine_spec(spec))

    return capabilities("r1", "healthy", views, specs, records, dict(QUEUE), True, features, **kw)


def test_capabilities_no_model_loaded_claims_no_engine_feature() -> None:
    """Configured but not loaded (or asleep): every engine flag is false; multiTenant is
    the runner's own and stays."""
    slots = [
        _slot("a", "llama-server", ModelState.ABSENT, path="/m.gguf"),
        _slot("b", "vllm", ModelState.SLEEPING, hf="org/b"),
    ]
    flags = _doc(slots)["capabilities"]
    assert flags == {
        "streaming": False,
        "prefixCaching": False,
        "multiTenant": True,
        "visionInput": False,
        "audioInput": False,
        "functionCalling": False,
    }


def test_capabilities_flags_are_those_of_the_loaded_engines() -> None:
    """A loaded vLLM without prefix caching streams but claims no prefix caching; a loaded
    llama-server beside it brings prefix caching; ComfyUI adds nothing."""
    vllm = _slot("v", "vllm", ModelState.READY, hf="org/v")
    comfy = _slot("c", "comfyui", ModelState.READY)
    flags = _doc([vllm, comfy], caching=False)["capabilities"]
    assert flags["streaming"] and not flags["prefixCaching"]
    llama = _slot("l", "llama-server", ModelState.DRAINING, path="/m.gguf")
    assert _doc([vllm, comfy, llama], caching=False)["capabilities"]["prefixCaching"]
    assert not any(v for k, v in _doc([comfy])["capabilities"].items() if k != "multiTenant")


def test_capabilities_runner_type_names_engines_and_versions() -> None:
    """`<engine>-<version>` per configured engine kind; unknown versions: the name alone."""
    slots = [
        _slot("a", "llama-server", ModelState.ABSENT, path="/m.gguf"),
        _slot("b", "vllm", ModelState.READY, hf="org/b"),
    ]
    versions = {"llama-server": LLAMA_SERVER_VERSION}
    expected = f"llama-server-{LLAMA_SERVER_VERSION}+vllm"
    assert _doc(slots, versions=versions)["runnerType"] == expected
    versions["vllm"] = "0.33.0"
    assert runner_type(["vllm", "vllm"], versions) == "vllm-0.33.0"
    assert runner_type([], versions).startswith("quorum-")


def test_capabilities_kv_and_queue_add_the_engines_figures() -> None:
    """KV size is summed and its use weighted by size; requests waiting inside engines add
    to the runner's queue depth, and `running` is the scheduler's slots held less those
    (the engines' own `running` figures are not read: they lag by a poll)."""
    slots = [
        _slot("a", "vllm", ModelState.READY, hf="org/a"),
        _slot("b", "vllm", ModelState.READY, hf="org/b"),
        _slot("c", "vllm", ModelState.ABSENT, hf="org/c"),
    ]
    engines = {
        "a": EngineLoad(1000, 0.5, waiting=2, running=3),
        "b": EngineLoad(3000, 0.1, waiting=1, running=0),
        "c": EngineLoad(5000, 1.0, waiting=9, running=9),  # not loaded: not counted
    }
    doc = _doc(slots, engines=engines)
    assert doc["resources"]["kvCacheSizeMB"] == 4000
    assert doc["resources"]["kvCacheUtilization"] == 0.2
    assert doc["queue"] == {**QUEUE, "depth": 5, "running": 1}


def test_capabilities_kv_use_without_sizes_is_the_mean() -> None:
    """Engines that report use but no size: the plain mean; none: 0."""
    assert kv_utilization([EngineLoad(0, 0.2), EngineLoad(0, 0.4)]) == 0.3
    assert kv_utilization([]) == 0.0


def test_capabilities_sleeping_model_is_available_not_loaded() -> None:
    """A vLLM in warm standby is listed as available, not loaded."""
    doc = _doc([_slot("b", "vllm", ModelState.SLEEPING, hf="org/b")])
    assert doc["models"]["loaded"] == [] and doc["models"]["available"] == ["b"]
