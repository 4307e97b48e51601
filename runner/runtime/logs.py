"""Logging set-up from LOG_LEVEL and LOG_FORMAT (json: one object per line).

A line logged inside a traced request carries its `trace_id` and `span_id` (set on the
record by runner/telemetry/tracing.py when tracing is on): fields of the JSON object, or
`trace_id=... span_id=...` at the end of a text line."""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        trace_id = getattr(record, "trace_id", None)
        if trace_id is not None:
            entry["trace_id"] = trace_id
            entry["span_id"] = getattr(record, "span_id", None)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        trace_id = getattr(record, "trace_id", None)
        if trace_id is None:
            return line
        return f"{line} trace_id={trace_id} span_id={getattr(record, 'span_id', None)}"


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    # Control-plane calls to engines (health polls, slot figures every 5 s) are not news.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
