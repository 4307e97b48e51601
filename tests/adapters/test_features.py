"""What engines offer clients (adapters/features.py), each kind declaring its own: the
flags `/v1/capabilities` reads."""

from __future__ import annotations

from adapters.comfyui.kind import ComfyUIKind
from adapters.features import NONE, Features, combined
from adapters.kind import EngineSettings, EngineSpec
from adapters.llama_server.kind import LlamaServerKind
from adapters.openai.kind import OpenAIKind
from adapters.vllm.kind import VllmKind
from adapters.whisper.kind import WhisperKind

ON = EngineSettings()


def _spec(backend: str, url: str | None = None, isolate: bool = True) -> EngineSpec:
    return EngineSpec("m", backend, 1, url=url, isolate_tenants=isolate)


def test_features_each_kind_declares_its_own() -> None:
    """LLM engines stream and cache prefixes; ComfyUI offers none of the LLM features;
    faster-whisper takes audio; an attached generic engine only streams."""
    assert LlamaServerKind(ON).features(_spec("llama-server")) == Features(True, True)
    assert VllmKind(ON).features(_spec("vllm")) == Features(True, True)
    assert ComfyUIKind(ON).features(_spec("comfyui")) == NONE
    assert WhisperKind(ON).features(_spec("faster-whisper")) == Features(audio_input=True)
    assert OpenAIKind(ON).features(_spec("openai", "http://h:1")) == Features(streaming=True)


def test_features_vllm_prefix_caching_follows_the_setting() -> None:
    """VLLM_ENABLE_PREFIX_CACHING=false turns vLLM's prefix caching off, nothing else."""
    off = EngineSettings(environ={"VLLM_ENABLE_PREFIX_CACHING": "false"})
    assert VllmKind(off).features(_spec("vllm")) == Features(streaming=True, prefix_caching=False)
    assert LlamaServerKind(off).features(_spec("llama-server")).prefix_caching


def test_features_attached_isolated_llama_server_caches_nothing() -> None:
    """An attached llama-server kept tenant-safe with cache_prompt: false reuses no prefix."""
    kind = LlamaServerKind(ON)
    assert not kind.features(_spec("llama-server", "http://h:1")).prefix_caching
    assert kind.features(_spec("llama-server", "http://h:1", isolate=False)).prefix_caching
    assert kind.features(_spec("llama-server")).prefix_caching
    single = LlamaServerKind(EngineSettings(multi_tenant=False))
    assert single.features(_spec("llama-server", "http://h:1")).prefix_caching


def test_features_combined_is_any_and_empty_is_none() -> None:
    """Nothing loaded claims nothing; otherwise a flag is on when any engine offers it."""
    audio = Features(audio_input=True)
    assert combined([]) == NONE
    assert combined([NONE, audio]) == audio
    assert combined([Features(True, True), audio]).to_json() == {
        "streaming": True,
        "prefixCaching": True,
        "visionInput": False,
        "audioInput": True,
        "functionCalling": False,
    }
