"""What the runner needs from an engine (`Engine`), and from one the chat path forwards to
(`ChatEngine`).

The chat path asks a chat engine where to send a request and how to adjust the body for
the request's cache mode and tenant, and asks it to read the cache and timing report out
of the engine's answer. Transport (the HTTP client, streaming) is the data path's job, so
every such engine shares the same fast forwarding code. What a kind of engine is as a
whole (started, probed, sized, its facets): `adapters/kind.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from adapters.http_client import EngineConnections
from adapters.lora import LoraAdapter
from faults import QuorumError
from faults.record import record


@record
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


@record
class Placement:
    """Where one granted request goes: the body to send, and the engine slot it took."""

    body: bytes
    slot: int | None = None
    strip: Callable[[bytes], bytes] | None = None  # applied to streamed chunks that need it


class Engine(Protocol):
    """What every engine is, whatever the request path that drives it."""

    model_id: str
    slots: int
    failure: str | None  # set when the engine process died: how (exit code, signal)
    cut: QuorumError | None  # set when the runner stops it under requests still on it
    # (an unload past its drain timeout): what those requests are answered

    def lost(self, reason: str) -> None:
        """The engine is gone (its process died, or it stopped answering): the requests
        still on it fail naming `reason`."""
        ...

    async def stop(self, grace_s: float) -> None:
        """Stop the engine: its connections closed, its own process (if any) ended with
        SIGTERM, `grace_s`, SIGKILL."""
        ...


class ChatEngine(Engine, Protocol):
    """An engine the chat path forwards to over HTTP.

    Order per request: `rewrite` (before admission; may refuse with a 400), then, once
    granted, `place` (may pick and prepare an engine slot), the forward on `http`, and
    `done` with the engine's report (exactly once per `place`).
    """

    base_url: str
    http: EngineConnections

    def rewrite(self, body: dict[str, Any], cache_mode: str, tenant: str) -> bool:
        """Adjust `body` in place for the engine; return True if it changed."""
        ...

    async def place(
        self,
        body: bytes,
        obj: dict[str, Any],
        tenant: str,
        tag: str | None,
        adapter: str | None = None,
    ) -> Placement:
        """Choose where the granted request runs; return what to send. `adapter` is the
        LoRA adapter the runner resolved the request's model to (None: the base model);
        only an `AdapterHost` is ever given one."""
        ...

    def done(self, placement: Placement, report: CacheReport) -> None:
        """The request placed by `place` ended (successfully or not)."""
        ...

    @property
    def holds_headers_for_first_chunk(self) -> bool:
        """True when a stream's first chunk carries the cache report the headers need."""
        ...

    def first_chunk_report(self, chunk: bytes) -> CacheReport | None:
        """The cache report in a stream's first chunk, when this engine sends one."""
        ...

    def report(self, response: dict[str, Any]) -> CacheReport:
        """Read cache and timing figures out of a parsed engine response."""
        ...

    async def diagnose(self) -> str | None:
        """After a failed exchange: how the engine process died, if it did (else None)."""
        ...

    async def flush(self, scope: FlushScope) -> FlushResult:
        """Remove the engine's cache entries in `scope`; say so when it cannot."""
        ...


@runtime_checkable
class AdapterHost(Protocol):
    """An engine that serves LoRA adapters on its base model (llama-server, vLLM)."""

    @property
    def adapter_ids(self) -> Collection[str]:
        """The adapters (model ids) this engine process has loaded now."""
        ...

    async def add_adapter(self, adapter: LoraAdapter) -> bool:
        """Load `adapter` into the running engine; False when this engine cannot (it must
        be started again with the new set: llama-server loads adapters only at start)."""
        ...

    async def remove_adapter(self, adapter_id: str) -> bool:
        """Unload it from the running engine; False when it must be started again."""
        ...

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request placed on this engine is still running (bounded)."""
        ...


class NoPlacement:
    """The `Engine` methods of an engine the runner places nothing on: no slots to pick,
    the body goes as it is, and no stream reports its cache on the first chunk."""

    async def place(
        self,
        body: bytes,
        obj: dict[str, Any],
        tenant: str,
        tag: str | None,
        adapter: str | None = None,
    ) -> Placement:
        return Placement(body)

    def done(self, placement: Placement, report: CacheReport) -> None:
        return None

    @property
    def holds_headers_for_first_chunk(self) -> bool:
        return False

    def first_chunk_report(self, chunk: bytes) -> CacheReport | None:
        return None
