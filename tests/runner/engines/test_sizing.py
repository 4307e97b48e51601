"""The policy the scheduler gets for a model spec (runner/engines/sizing.py, by its kind)."""

from __future__ import annotations

import pytest

from runner.engines.kinds import EngineKinds
from runner.engines.sizing import policy_for
from runner.floor.models_file import ModelSpec

KINDS = EngineKinds()


def slot_group(spec: ModelSpec) -> str | None:
    """The slot group its kind names for `spec`."""
    return KINDS.of(spec).slot_group(KINDS.engine_spec(spec))


pytestmark = pytest.mark.timeout(30)


def test_sizing_slot_group_of_a_spec_names_its_engine_process() -> None:
    """ComfyUI models share their server's group (each kind's `slot_group`); a vLLM
    attached by url shares that URL's; a model the runner starts alone, or an openai URL,
    has its own."""

    def spec(**fields: object) -> ModelSpec:
        return ModelSpec.model_validate({"id": "m", **fields})

    url = "http://127.0.0.1:8188"
    assert slot_group(spec(backend="comfyui", url=url + "/")) == f"comfyui:{url}"
    assert slot_group(spec(backend="comfyui")) == "comfyui:spawned"
    assert slot_group(spec(backend="vllm", url=url)) == f"vllm:{url}"
    assert slot_group(spec(backend="vllm", hf="Qwen/Qwen3-0.6B")) is None
    assert slot_group(spec(backend="openai", url=url)) is None
    assert slot_group(spec(backend="llama-server", path="/m.gguf")) is None


def test_sizing_policy_carries_the_slot_group() -> None:
    """Attached or started, a ComfyUI model's policy names its server's slot group."""
    attached = ModelSpec(id="sd", backend="comfyui", url="http://h:1", checkpoint="c.safetensors")
    started = ModelSpec(id="sd", backend="comfyui", checkpoint="c.safetensors")
    assert policy_for(attached, KINDS, None, None).slot_group == "comfyui:http://h:1"
    assert policy_for(started, KINDS, None, None).slot_group == "comfyui:spawned"
