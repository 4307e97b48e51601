"""What each engine kind can do for a client: the one table `/v1/capabilities` reads.

The seed's `capabilities` flags (`streaming`, `prefixCaching`, `functionCalling`,
`visionInput`, `audioInput`) describe what the runner's *loaded* engines offer: a runner
with nothing loaded claims none of them (`multiTenant` is the runner's own, not an
engine's). Each backend declares its features here; `docs/engines.md` says why each one
is on or off:

| backend          | streaming | prefixCaching                 | functionCalling | vision | audio |
|------------------|-----------|-------------------------------|-----------------|--------|-------|
| llama-server     | yes       | yes (per tenant, runner slots)| no (no --jinja) | no     | no    |
| vllm             | yes       | VLLM_ENABLE_PREFIX_CACHING    | no (no parser)  | no     | no    |
| comfyui          | no        | no (no KV cache)              | no              | no     | no    |
| faster-whisper   | no        | no                            | no              | no     | yes   |
| openai (by URL)  | yes       | no (unknown: not claimed)     | no              | no     | no    |

Pure data and pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Features:
    """What one engine offers its clients."""

    streaming: bool = False
    prefix_caching: bool = False
    function_calling: bool = False
    vision_input: bool = False
    audio_input: bool = False

    def to_json(self) -> dict[str, bool]:
        """The engine flags of the seed's `capabilities` section."""
        return {
            "streaming": self.streaming,
            "prefixCaching": self.prefix_caching,
            "visionInput": self.vision_input,
            "audioInput": self.audio_input,
            "functionCalling": self.function_calling,
        }


NONE = Features()

BACKEND_FEATURES: dict[str, Features] = {
    "llama-server": Features(streaming=True, prefix_caching=True),
    "vllm": Features(streaming=True, prefix_caching=True),
    "comfyui": NONE,
    "faster-whisper": Features(audio_input=True),
    "openai": Features(streaming=True),
}
"""Each backend's features at its best; `model_features` turns off what settings turn off."""


def model_features(
    backend: str,
    *,
    attached: bool = False,
    isolated: bool = False,
    vllm_prefix_caching: bool = True,
) -> Features:
    """What one loaded model's engine offers.

    1. The backend's row of `BACKEND_FEATURES` (an unknown backend offers nothing).
    2. vLLM: prefix caching only with VLLM_ENABLE_PREFIX_CACHING (the runner starts it
       with `--no-enable-prefix-caching` otherwise; an attached one is assumed to follow
       the same setting).
    3. An attached llama-server whose tenants are kept apart (`isolated`) is sent
       `cache_prompt: false` on every request: no prefix caching.
    """
    features = BACKEND_FEATURES.get(backend, NONE)  # 1
    if backend == "vllm" and not vllm_prefix_caching:  # 2
        features = replace(features, prefix_caching=False)
    if backend == "llama-server" and attached and isolated:  # 3
        features = replace(features, prefix_caching=False)
    return features


def combined(features: Iterable[Features]) -> Features:
    """A feature is offered when any loaded engine offers it; nothing loaded: none."""
    out = NONE
    for f in features:
        out = Features(
            out.streaming or f.streaming,
            out.prefix_caching or f.prefix_caching,
            out.function_calling or f.function_calling,
            out.vision_input or f.vision_input,
            out.audio_input or f.audio_input,
        )
    return out
