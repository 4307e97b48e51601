"""What the runner needs from an engine, whatever kind it is.

An adapter knows one engine kind. The data path asks it where to send a
request and how to adjust the body for the request's cache mode and tenant,
and asks it to read the cache and timing report out of the engine's answer.
Transport (the HTTP client, streaming) is the data path's job, so every
adapter shares the same fast forwarding code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class CacheReport:
    """What the engine said about one finished request (0/False when unknown)."""

    cache_hit: bool = False
    tokens_reused: int = 0
    gpu_time_ms: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


NO_REPORT = CacheReport()


@dataclass(frozen=True, slots=True)
class FlushResult:
    flushed: bool
    entries_removed: int = 0
    memory_freed_mb: int = 0
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class FlushScope:
    """Which cache entries a flush removes (the seed's `scope` and its selector)."""

    scope: str  # "all" | "model" | "tenant" | "tag"
    model_id: str | None = None
    tenant_id: str | None = None
    tag: str | None = None


class Engine(Protocol):
    """One engine serving one model, as the data path sees it."""

    model_id: str
    base_url: str
    slots: int

    def rewrite(self, body: dict[str, object], cache_mode: str, tenant: str) -> bool:
        """Adjust `body` in place for the engine; return True if it changed."""
        ...

    def report(self, response: dict[str, object]) -> CacheReport:
        """Read cache and timing figures out of a parsed engine response."""
        ...

    async def flush(self, scope: FlushScope) -> FlushResult:
        """Remove the engine's cache entries in `scope`; say so when it cannot."""
        ...
