"""The per-backend feature table that `/v1/capabilities` reads (adapters/features.py)."""

from __future__ import annotations

from adapters.features import BACKEND_FEATURES, NONE, Features, combined, model_features


def test_features_table_declares_each_backend() -> None:
    """LLM engines stream and cache prefixes; ComfyUI offers none of the LLM features;
    faster-whisper takes audio; an attached generic engine only streams."""
    assert model_features("llama-server") == Features(streaming=True, prefix_caching=True)
    assert model_features("vllm") == Features(streaming=True, prefix_caching=True)
    assert model_features("comfyui") == NONE
    assert model_features("faster-whisper") == Features(audio_input=True)
    assert model_features("openai") == Features(streaming=True)
    assert model_features("tgi") == NONE
    assert not any(f.function_calling or f.vision_input for f in BACKEND_FEATURES.values())


def test_features_vllm_prefix_caching_follows_the_setting() -> None:
    """VLLM_ENABLE_PREFIX_CACHING=false turns vLLM's prefix caching off, nothing else."""
    off = model_features("vllm", vllm_prefix_caching=False)
    assert off == Features(streaming=True, prefix_caching=False)
    assert model_features("llama-server", vllm_prefix_caching=False).prefix_caching


def test_features_attached_isolated_llama_server_caches_nothing() -> None:
    """An attached llama-server kept tenant-safe with cache_prompt: false reuses no prefix."""
    assert not model_features("llama-server", attached=True, isolated=True).prefix_caching
    assert model_features("llama-server", attached=True, isolated=False).prefix_caching
    assert model_features("llama-server", attached=False, isolated=True).prefix_caching


def test_features_combined_is_any_and_empty_is_none() -> None:
    """Nothing loaded claims nothing; otherwise a flag is on when any engine offers it."""
    assert combined([]) == NONE
    both = combined([model_features("comfyui"), model_features("faster-whisper")])
    assert both == Features(audio_input=True)
    assert combined([model_features("vllm"), model_features("faster-whisper")]).to_json() == {
        "streaming": True,
        "prefixCaching": True,
        "visionInput": False,
        "audioInput": True,
        "functionCalling": False,
    }
