"""What the runner reads back from vLLM's answers, as pure functions (facts: the module
docstring of `adapters/vllm/engine.py`, from vLLM 0.32.0's source).

- A stream's usage-only last chunk (`"choices": []`), which the runner asks for on every
  stream, is taken out again when the client did not ask (`strip_usage_chunk`).
- The cache report: `usage.prompt_tokens_details.cached_tokens`, plus GPU time from the
  per-request `metrics` when vLLM sends them (`report_from_vllm`).
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters.base import CacheReport
from adapters.reports import report_from_openai


def strip_usage_chunk(chunk: bytes) -> bytes:
    """Take the usage-only event (`"choices": []` with `usage`) out of streamed bytes: the
    runner asked for it, the client did not. Everything else passes unchanged."""
    if b'"usage"' not in chunk:
        return chunk
    out: list[bytes] = []
    for event in chunk.split(b"\n\n"):
        if b'"usage"' in event and event.startswith(b"data: {"):
            try:
                parsed = orjson.loads(event[6:])
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict) and parsed.get("choices") == []:
                continue
        out.append(event)
    return b"\n\n".join(out)


def report_from_vllm(response: dict[str, Any]) -> CacheReport:
    """`report_from_openai`, plus GPU time from vLLM's per-request `metrics` when present
    (`--enable-per-request-metrics`: time to first token + decode time, in ms)."""
    report = report_from_openai(response)
    metrics = response.get("metrics")
    if not isinstance(metrics, dict):
        return report
    total = 0.0
    for key in ("time_to_first_token_ms", "generation_time_ms"):
        v = metrics.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            total += v
    if not total:
        return report
    return CacheReport(
        report.cache_hit,
        report.tokens_reused,
        round(total),
        report.input_tokens,
        report.output_tokens,
    )
