"""What an engine's answer reports, read for the chat path (runner/http/chat.py): the
cache and usage figures (`took`, `sniff_report`, what the call cost: runner/tenancy/guard.py)
and the runner's headers on the answer (`response_headers`)."""

from __future__ import annotations

import orjson

from adapters.base import CacheReport, ChatEngine
from runner.http.asgi import FALSE_REPORT_HEADERS
from runner.http.call import ClientCall


def response_headers(
    call: ClientCall, report: CacheReport, ctype: bytes
) -> list[tuple[bytes, bytes]]:
    """The runner's headers on an answer: cache report, queue wait, GPU time, ids, limits."""
    if report.cache_hit:
        headers = [
            (b"x-cache-hit", b"true"),
            (b"x-cache-tokens-reused", b"%d" % report.tokens_reused),
        ]
    else:
        headers = list(FALSE_REPORT_HEADERS)
    headers += [
        (b"content-type", ctype),
        (b"x-queue-wait-ms", b"%d" % call.queue_wait_ms),
        (b"x-gpu-time-ms", b"%d" % report.gpu_time_ms),
        (b"x-request-id", call.request_id.encode()),
    ]
    headers += call.limits
    return headers


def took(call: ClientCall, report: CacheReport, *, final: bool) -> CacheReport:
    """The engine's figures, when `report` has them: what the call cost if `final` (a
    whole answer), else once the stream has ended (`guard.Spent.used`)."""
    if report.input_tokens or report.output_tokens:
        spent = call.spent
        spent.reported = final
        spent.prompt, spent.completion = report.input_tokens, report.output_tokens
        spent.cached = report.tokens_reused
    return report


def sniff_report(engine: ChatEngine, chunk: bytes) -> CacheReport | None:
    """Find the usage block (or llama-server's timings) in a streamed chunk (the final
    one carries it)."""
    for line in chunk.split(b"\n"):
        if line.startswith(b"data: {") and (b'"usage"' in line or b'"timings"' in line):
            try:
                parsed = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue
            if isinstance(parsed, dict) and (
                isinstance(parsed.get("usage"), dict) or isinstance(parsed.get("timings"), dict)
            ):
                return engine.report(parsed)
    return None
