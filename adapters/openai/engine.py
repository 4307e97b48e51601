"""An OpenAI-compatible engine that is already running, attached by URL.

The runner does not own its process, so it cannot erase or pin its cache, or restart it.
It forwards requests and reads the standard `usage` block
(`prompt_tokens_details.cached_tokens`) and llama.cpp's `timings` when present.

Tenant isolation of an attached engine's prefix cache (`ENABLE_MULTI_TENANT`, see
`docs/engines.md`): what the runner can send is all it has. `isolation` says what that is:

- `"cache_prompt_off"` (an attached llama-server): every request goes with
  `cache_prompt: false`, so no request reuses another's prompt (nor its own);
- `"none"`: forwarded as sent - the models file said the engine is single-tenant or the
  operator accepted a shared cache (`shared_cache: true`), or it is a generic `openai`
  engine the runner knows nothing of (warned about at start-up).
"""

from __future__ import annotations

from typing import Any, Literal

from adapters.base import CacheReport, FlushResult, FlushScope, NoPlacement
from adapters.http_client import EngineConnections
from adapters.llama_server.protocol import strip_client_cache_fields
from adapters.reports import report_from_openai
from faults import QuorumError

Isolation = Literal["none", "cache_prompt_off"]


class AttachedOpenAIEngine(NoPlacement):
    def __init__(
        self,
        model_id: str,
        url: str,
        slots: int,
        http: EngineConnections,
        isolation: Isolation = "none",
    ) -> None:
        self.model_id = model_id
        self.base_url = url.rstrip("/")
        self.slots = slots
        self.http = http
        self.isolation = isolation
        self.failure: str | None = None
        self.cut: QuorumError | None = None

    def rewrite(self, body: dict[str, Any], cache_mode: str, tenant: str) -> bool:
        """Isolated: the client's cache fields out, `cache_prompt: false` in. Always: no
        client picks a LoRA adapter (llama-server's per-request `lora`) on an engine the
        runner cannot see into."""
        if self.isolation == "cache_prompt_off":
            strip_client_cache_fields(body)
            body["cache_prompt"] = False
            return True
        return body.pop("lora", None) is not None

    def report(self, response: dict[str, Any]) -> CacheReport:
        return report_from_openai(response)

    async def diagnose(self) -> str | None:
        return None  # not our process: nothing more to tell

    def lost(self, reason: str) -> None:
        self.failure = reason
        self.http.close()

    async def stop(self, grace_s: float) -> None:
        self.http.close()  # not our process: nothing else to stop

    async def flush(self, scope: FlushScope) -> FlushResult:
        return FlushResult(False, reason="engine attached by URL: the runner cannot flush it")
