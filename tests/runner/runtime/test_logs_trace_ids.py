"""Log lines of a traced request carry its trace and span ids (runner/runtime/logs.py)."""

from __future__ import annotations

import logging

import orjson

from runner.runtime.logs import JsonFormatter, TextFormatter

TRACE_ID, SPAN_ID = "ab" * 16, "cd" * 8


def _record(traced: bool) -> logging.LogRecord:
    record = logging.LogRecord("quorum.chat", logging.INFO, __file__, 1, "served %s", ("x",), None)
    if traced:
        record.trace_id, record.span_id = TRACE_ID, SPAN_ID
    return record


def test_logs_json_line_carries_trace_and_span_ids() -> None:
    """A JSON line of a traced request has `trace_id` and `span_id`; an untraced one has
    neither."""
    traced = orjson.loads(JsonFormatter().format(_record(True)))
    assert traced["trace_id"] == TRACE_ID and traced["span_id"] == SPAN_ID
    assert traced["msg"] == "served x"
    plain = orjson.loads(JsonFormatter().format(_record(False)))
    assert "trace_id" not in plain and "span_id" not in plain


def test_logs_text_line_ends_with_trace_and_span_ids() -> None:
    """A text line of a traced request ends with `trace_id=... span_id=...`; an untraced
    one is as before."""
    line = TextFormatter().format(_record(True))
    assert line.endswith(f"served x trace_id={TRACE_ID} span_id={SPAN_ID}")
    assert TextFormatter().format(_record(False)).endswith("INFO quorum.chat: served x")
