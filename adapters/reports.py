"""Cache and timing figures out of OpenAI-shaped engine answers (vLLM and llama-server).

Tokens: `usage` when the answer has it; else llama-server's `timings`, which ride on a
stream's last chunk even without `stream_options.include_usage`: the prompt is
`prompt_n` (evaluated) plus `cache_n` (taken from the cache), the completion `predicted_n`
(the same figures its `/metrics` counters add up).
"""

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
        if not isinstance(usage, dict):
            inp = _int(timings.get("prompt_n")) + _int(timings.get("cache_n"))
            out = _int(timings.get("predicted_n"))
        total = 0.0
        for key in ("prompt_ms", "predicted_ms"):
            v = timings.get(key)
            if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
                total += v
        gpu_ms = round(total)
    return CacheReport(reused > 0, reused, gpu_ms, inp, out)
