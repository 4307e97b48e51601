"""An OpenAI-compatible engine that is already running, attached by URL.

The runner does not own its process, so it cannot flush its cache or restart
it; it forwards requests unchanged and reads the standard `usage` block
(`prompt_tokens_details.cached_tokens`) and llama.cpp's `timings` when present.
"""

from __future__ import annotations

from adapters.base import CacheReport, FlushResult, FlushScope


class AttachedOpenAIEngine:
    def __init__(self, model_id: str, url: str, slots: int) -> None:
        self.model_id = model_id
        self.base_url = url.rstrip("/")
        self.slots = slots

    def rewrite(self, body: dict[str, object], cache_mode: str, tenant: str) -> bool:
        return False

    def report(self, response: dict[str, object]) -> CacheReport:
        return report_from_openai(response)

    async def flush(self, scope: FlushScope) -> FlushResult:
        return FlushResult(False, reason="engine attached by URL: the runner cannot flush it")


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def report_from_openai(response: dict[str, object]) -> CacheReport:
    """Cache and timing figures from an OpenAI-shaped body (vLLM and llama-server both)."""
    usage = response.get("usage")
    reused = inp = out = 0
    if isinstance(usage, dict):
        inp = _int(usage.get("prompt_tokens"))
        out = _int(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            reused = _int(details.get("cached_tokens"))
    gpu_ms = 0
    timings = response.get("timings")
    if isinstance(timings, dict):
        reused = reused or _int(timings.get("cache_n"))
        total = 0.0
        for key in ("prompt_ms", "predicted_ms"):
            v = timings.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                total += v
        gpu_ms = round(total)
    return CacheReport(reused > 0, reused, gpu_ms, inp, out)
