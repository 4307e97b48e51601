"""A generic OpenAI-compatible engine attached by URL as an engine kind (`backend: openai`).

What the runner can and cannot know of such an engine: this package's docstring
(`adapters/openai/__init__.py`).
"""

from __future__ import annotations

import logging

from adapters.features import Features
from adapters.fields import RequestFields
from adapters.http_client import EngineConnections
from adapters.kind import EngineSettings, EngineSpec, Host, KindDefaults, Traits
from adapters.launched import Launched
from adapters.openai.engine import AttachedOpenAIEngine, Isolation

log = logging.getLogger("quorum.pool")

_REWRITTEN = frozenset({"cache_prompt", "id_slot", "slot_id", "n_cache_reuse", "lora"})
ATTACHED_FIELDS = RequestFields(
    chat=_REWRITTEN,
    completions=_REWRITTEN,
    uncounted=frozenset(
        {
            "n_predict",
            "n_cmpl",
            "best_of",
            "use_beam_search",
            "max_new_tokens",
            "n_keep",
            "n_discard",
            "num_predict",
        }
    ),
)
"""OpenAI's fields, and the cache and adapter fields `rewrite` removes (isolated) or keeps
(`AttachedOpenAIEngine`): nothing an unknown engine might read as more work. `uncounted`:
the names known engines (llama-server, vLLM, TGI, Ollama) read as more tokens or
completions, never passed through (the models file's `pass_through`)."""


def attach_openai(
    spec: EngineSpec, settings: EngineSettings, slots: int, isolation: Isolation
) -> Launched:
    """An OpenAI-compatible engine somebody else runs at `spec.url`: forwarded to, its
    tenants kept apart by what is sent (`isolation`)."""
    assert spec.url is not None
    if spec.shared_cache:
        log.warning("model %s: shared_cache is on: tenants share its prefix cache", spec.model_id)
    http = EngineConnections(spec.url, settings.connect_timeout_s, settings.read_timeout_s)
    engine = AttachedOpenAIEngine(spec.model_id, spec.url, slots, http, isolation)
    return Launched(engine, None, url=spec.url, chat=engine, flush=engine.flush)


class OpenAIKind(KindDefaults):
    name = "openai"
    traits = Traits(
        request_path="chat",
        default_parallel=8,
        probe_path="/v1/models",
        request_fields=ATTACHED_FIELDS,
    )

    def check(self, spec: EngineSpec) -> None:
        if not spec.url:
            raise ValueError("backend 'openai' needs a url")
        super().check(spec)

    def features(self, spec: EngineSpec) -> Features:
        """It streams; whether it caches prefixes is not known: not claimed."""
        return Features(streaming=True)

    async def attach(self, spec: EngineSpec, host: Host) -> Launched:
        if self.settings.multi_tenant and spec.isolate_tenants:
            log.warning(
                "model %s: generic OpenAI engine attached by URL; the runner cannot keep "
                "tenants apart in its prefix cache (mark it single_tenant or shared_cache to "
                "silence this)",
                spec.model_id,
            )
        return attach_openai(spec, self.settings, spec.slots, "none")
