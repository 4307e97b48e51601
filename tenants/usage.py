"""Usage you can bill from: per tenant, model and UTC hour (pure).

`Counts` is what one (tenant, model, hour) accumulated; `rows` turns stored hours into
the answer of `GET /v1/usage` (grouped by hour or day). The runner adds to counts as
requests end (runner/tenancy/usage.py) and flushes them to a store
(`tenants/usage_store.py`: SQLite or Redis).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime

HOUR = 3600
DAY = 86400
OUTCOMES = ("ok", "cancelled", "refused", "failed")
INT_FIELDS = (
    "requests",
    "ok",
    "cancelled",
    "refused",
    "failed",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "images",
)
FLOAT_FIELDS = ("engine_seconds", "queue_seconds", "audio_seconds")


def outcome(status: int) -> str:
    """A request's outcome by its status: ok (2xx), cancelled (499: the client left),
    refused (the runner said no: other 4xx, 503), failed (other 5xx)."""
    if status < 400:
        return "ok"
    if status == 499:
        return "cancelled"
    if status < 500 or status == 503:
        return "refused"
    return "failed"


@dataclass(slots=True)
class Counts:
    requests: int = 0
    ok: int = 0
    cancelled: int = 0
    refused: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    images: int = 0
    engine_seconds: float = 0.0
    queue_seconds: float = 0.0
    audio_seconds: float = 0.0

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def items(self) -> Iterable[tuple[str, int | float]]:
        """The non-zero counters (what a store writes)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value:
                yield f.name, value

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "requestsByOutcome": {o: getattr(self, o) for o in OUTCOMES},
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "cachedTokens": self.cached_tokens,
            "engineSeconds": round(self.engine_seconds, 3),
            "queueSeconds": round(self.queue_seconds, 3),
            "images": self.images,
            "audioSeconds": round(self.audio_seconds, 3),
        }


Key = tuple[int, str, str]
"""(hour start, tenant, model)."""


def hour_of(now: float) -> int:
    return int(now // HOUR) * HOUR


def iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rows(hours: Mapping[Key, Counts], group_by: str) -> list[dict[str, object]]:
    """The usage rows: per tenant, model and hour (or UTC day), oldest first, then by
    tenant and model."""
    size = HOUR if group_by == "hour" else DAY
    grouped: dict[Key, Counts] = {}
    for (hour, tenant, model), counts in hours.items():
        key = (hour // size * size, tenant, model)
        grouped.setdefault(key, Counts()).add(counts)
    return [
        {"tenant": tenant, "model": model, "start": iso(start), **counts.to_json()}
        for (start, tenant, model), counts in sorted(grouped.items())
    ]
