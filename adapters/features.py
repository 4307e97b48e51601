"""What an engine can do for a client: the flags `/v1/capabilities` reads.

The seed's `capabilities` flags (`streaming`, `prefixCaching`, `functionCalling`,
`visionInput`, `audioInput`) describe what the runner's *loaded* engines offer: a runner
with nothing loaded claims none of them (`multiTenant` is the runner's own, not an
engine's). Each engine kind declares its own (`EngineKind.features`, in
`adapters/<kind>/kind.py`); `docs/engines.md` says why each one is on or off:

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
from dataclasses import dataclass


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
