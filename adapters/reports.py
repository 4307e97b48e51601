"""Cache and timing figures out of OpenAI-shaped engine answers (vLLM and llama-server)."""

from __future__ import annotations

from typing import Any

from adapters.base import CacheReport


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def report_from_openai(response: dict[str, Any]) -> CacheReport:
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
