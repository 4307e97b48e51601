"""Governed LoRA adapter loads and unloads.

    POST /v1/adapters/load    {adapterId, baseModel, path, sha256, tenants, scale?,
                               verifiedOpToken}  -> 200 the adapter (capabilities' entry)
    POST /v1/adapters/unload  {adapterId, baseModel, sha256, verifiedOpToken}
                                                 -> 200 {adapterId, unloaded: true}

Both go the way of every lifecycle call (`runner/lifecycle/governed.py`):

    1. parse strictly (400): known fields, right types (syntax only: nothing that depends
       on this runner's files or settings);
    2. approve: operation `adapter-load` / `adapter-unload`, `modelId` = the adapter's id,
       params = the body's other fields exactly as sent, so the signers approve this
       adapter on this base with this file (its sha256) for these tenants (audited);
    3. only then check what it names, so that nobody without a token learns which models,
       adapters or files exist (docs/security.md): the path inside the allowed model
       roots (400), the base is a model of this runner
       (404) whose engine kind serves adapters (`Traits.adapters`; 400), the id is free
       (load) or an adapter of that base (unload) (409 / 404), room under the base's
       `max_adapters` (its kind's `adapter_room`; 409), the
       base not in the middle of a load, an unload or a sleep (409); a load's file has the
       sha256 given (400);
    4. load: rank and size read from the file (an engine started with it checks its sha256
       again as it loads it); unload: the adapter stops taking requests (503
       `model_unloading`) and the ones it has finish (bounded by UNLOAD_DRAIN_TIMEOUT_S);
    5. run, one operation per base at a time: a base without a running engine only has
       its set changed (its next start loads it); a running one loads or unloads it in
       place (vLLM), or is started again with the new set beside the old engine, which
       drains before it stops (llama-server loads adapters only at start); no request of
       the base or its other adapters is refused, and no other model is touched.

A governed adapter lasts until it is unloaded or the runner stops (a restart serves the
models file's adapters only).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from adapters.lora import LoraAdapter, file_digest, read_rank, size_mb
from runner.engines.adapters import AdapterBook, AdapterRecord, AdapterState
from runner.engines.pool import ModelPool
from runner.errors import AdapterRefused, BadRequest, ModelNotFound, QuorumError
from runner.floor.models_file import ModelSpec
from runner.lifecycle.catalog import Roots, inside
from runner.lifecycle.governed import GovernedOps, GovernedRequest, governed_request, parse_body
from runner.scheduler import ModelState, SchedulerAdmission

log = logging.getLogger("quorum.adapters")

LOAD_FIELDS = frozenset(
    {"adapterId", "baseModel", "path", "sha256", "tenants", "scale", "verifiedOpToken"}
)
UNLOAD_FIELDS = frozenset({"adapterId", "baseModel", "sha256", "verifiedOpToken"})
_HEX = frozenset("0123456789abcdef")


class AdapterOps:
    """The governed adapter operations of one runner."""

    def __init__(
        self,
        pool: ModelPool,
        scheduler: SchedulerAdmission,
        governed: GovernedOps,
        roots: Roots,
        *,
        drain_timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.specs = pool.specs
        self.book: AdapterBook = pool.adapters
        self.scheduler = scheduler
        self.governed = governed
        self.roots = roots
        self.drain_timeout_s = drain_timeout_s
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}

    async def load(self, body: bytes, header_token: str | None) -> dict[str, object]:
        doc = parse_body(body)  # 1
        adapter = self._parse_load(doc)
        await self.governed.approve("adapter-load", _governed(doc, header_token))  # 2
        adapter = replace(adapter, path=self._resolve(adapter.path))  # 3
        spec = self._check_base(adapter.base)
        if adapter.id in self.book or self.specs.spec(adapter.id) is not None:
            raise AdapterRefused(f"model id {adapter.id!r} is already taken on this runner")
        capacity = self.specs.kind(spec).adapter_room(self.specs.kinds.engine_spec(spec))
        if capacity is not None and self.book.count(adapter.base) >= capacity:
            raise AdapterRefused(
                f"model {adapter.base!r} has room for {capacity} adapters (max_adapters), all taken"
            )
        self._check_running(adapter.base)
        path = Path(adapter.path)
        digest = await asyncio.to_thread(_digest_or_none, path)
        if digest != adapter.sha256:
            raise BadRequest(
                f"adapter {adapter.id!r}: the file's sha256 is not the one given"
                if digest is not None
                else f"adapter {adapter.id!r}: its file cannot be read"
            )
        adapter = replace(adapter, rank=read_rank(path), size_mb=size_mb(path))  # 4
        started = time.monotonic()
        async with self._lock(adapter.base):  # 5
            self._check_running(adapter.base)
            record = self.book.add(adapter, AdapterState.ADDING)
            try:
                await self._add(record)
            except BaseException:
                self.book.remove(adapter.id)
                raise
        record.loaded_at = int(self.clock())
        log.info("adapter %s loaded on %s", adapter.id, adapter.base)
        answer = adapter_entry(record, self.loaded(record))
        answer["loadTimeMs"] = round(1000 * (time.monotonic() - started))
        return answer

    async def unload(self, body: bytes, header_token: str | None) -> dict[str, object]:
        doc = parse_body(body)  # 1
        unknown = set(doc) - UNLOAD_FIELDS
        if unknown:
            raise BadRequest(f"unknown field(s) in adapter unload: {', '.join(sorted(unknown))}")
        adapter_id, base, sha = _text(doc, "adapterId"), _text(doc, "baseModel"), _sha(doc)
        await self.governed.approve("adapter-unload", _governed(doc, header_token))  # 2
        record = self.book.get(adapter_id)  # 3
        if record is None or record.adapter.base != base:
            raise ModelNotFound(f"model {base!r} has no adapter {adapter_id!r}")
        if record.state in (AdapterState.ADDING, AdapterState.REMOVING):
            raise AdapterRefused(f"adapter {adapter_id!r} is being loaded or unloaded")
        self._check_running(base)
        if record.adapter.sha256 is not None and record.adapter.sha256 != sha:
            raise BadRequest(f"adapter {adapter_id!r} is not the one with that sha256")
        async with self._lock(base):
            record.state = AdapterState.REMOVING  # 4
            try:
                await self._drain(record)
                await self._remove(record)  # 5
            except BaseException:
                record.state = AdapterState.ACTIVE
                raise
            self.book.remove(adapter_id)
        log.info("adapter %s unloaded from %s", adapter_id, base)
        return {"adapterId": adapter_id, "baseModel": base, "unloaded": True}

    def loaded(self, record: AdapterRecord) -> bool:
        """Its base's running engine has it now."""
        return self.book.loaded(record)

    # -- steps -------------------------------------------------------------------------

    def _parse_load(self, doc: dict[str, Any]) -> LoraAdapter:
        unknown = set(doc) - LOAD_FIELDS
        if unknown:
            raise BadRequest(f"unknown field(s) in adapter load: {', '.join(sorted(unknown))}")
        adapter_id, base = _text(doc, "adapterId"), _text(doc, "baseModel")
        path = _text(doc, "path")  # where it points is looked at after approval (`_resolve`)
        tenants = doc.get("tenants")
        if (
            not isinstance(tenants, list)
            or not tenants
            or not all(isinstance(t, str) and 0 < len(t) <= 64 for t in tenants)
        ):
            raise BadRequest("tenants must be a non-empty list of tenant ids or patterns")
        scale = doc.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 4:
            raise BadRequest("scale must be a number above 0 and at most 4")
        name = adapter_id.rsplit(":", 1)[-1].lower()
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in name)[:63] or "adapter"
        return LoraAdapter(
            id=adapter_id,
            name=name,
            base=base,
            path=path,
            tenants=tuple(tenants),
            sha256=_sha(doc),
            scale=float(scale),
            governed=True,
        )

    def _resolve(self, text: str) -> str:
        """The adapter's path inside the model roots, or 400; asked after approval only:
        where the roots are, like what exists under them, is nobody's to probe without a
        token."""
        path = Path(text.replace("\x00", "\ufffd"))
        try:
            path = path.expanduser()
            if not path.is_absolute():
                path = self.roots.model_base / path
            usable = ".." not in path.parts and inside(path, self.roots.allowed())
        except (OSError, ValueError, RuntimeError):  # a name the file system refuses; a
            usable = False  # `~user` of no user (`expanduser` raises RuntimeError)
        if not usable:
            raise BadRequest("path must name an adapter file or folder inside the model roots")
        return str(path)

    def _check_base(self, base: str) -> ModelSpec:
        """The base's spec, once it can serve adapters."""
        spec = self.specs.spec(base)
        if spec is None:
            known = ", ".join(sorted(self.specs.specs())) or "none"
            raise ModelNotFound(model=base, models=known)
        if not self.specs.kind(spec).traits.adapters or spec.attached:
            raise BadRequest(
                f"model {base!r} cannot serve adapters (backend {spec.backend}"
                f"{', attached by URL' if spec.attached else ''})"
            )
        return spec

    def _check_running(self, base: str) -> None:
        """The base is not changing state: absent or failed (its next start picks the set
        up) or ready and staying (the running engine takes the change)."""
        view = self.scheduler.models().get(base)
        if view is None:
            return
        moving = view.state in (
            ModelState.LOADING,
            ModelState.DRAINING,
            ModelState.STOPPING,
            ModelState.SLEEPING,
        )
        if moving or view.unloading:
            raise AdapterRefused(
                f"model {base!r} is {view.state.value}; retry once it is ready or stopped"
            )

    def _lock(self, base: str) -> asyncio.Lock:
        return self._locks.setdefault(base, asyncio.Lock())

    async def _add(self, record: AdapterRecord) -> None:
        """Step 5 of a load: into the running engine (in place, or started again with it),
        else into the set its next start loads."""
        base = record.adapter.base
        engine = self.pool.ready.adapters.get(base)
        if engine is not None:
            if await _engine_call(engine.add_adapter(record.adapter)):
                record.state = AdapterState.ACTIVE
                return
            record.state = AdapterState.ACTIVE  # the new engine is started with it
            await _engine_call(self.pool.restart_engine(base))
            return
        record.state = AdapterState.ACTIVE

    async def _drain(self, record: AdapterRecord) -> None:
        """Wait (bounded) until the adapter's own requests are done."""
        try:
            await asyncio.wait_for(record.idle.wait(), self.drain_timeout_s)
        except TimeoutError:
            log.warning("adapter %s: requests still on it after the drain", record.adapter.id)

    async def _remove(self, record: AdapterRecord) -> None:
        base = record.adapter.base
        engine = self.pool.ready.adapters.get(base)
        if engine is None or record.adapter.id not in engine.adapter_ids:
            return
        if not await _engine_call(engine.remove_adapter(record.adapter.id)):
            record.state = AdapterState.REMOVING  # not in the set the new engine starts with
            await _engine_call(self.pool.restart_engine(base))


async def _engine_call(call: Any) -> Any:
    """An engine operation; its failure becomes a 409 naming it (the engine serves on)."""
    try:
        return await call
    except QuorumError as exc:
        if exc.status < 500:
            raise
        raise AdapterRefused(f"the engine could not do it: {exc}") from None


def adapter_entry(record: AdapterRecord, loaded: bool) -> dict[str, object]:
    """An adapter as capabilities and the load answer list it."""
    a = record.adapter
    state = "failed" if record.state is AdapterState.FAILED else record.state.value
    if record.state is AdapterState.ACTIVE:
        state = "loaded" if loaded else "available"
    return {
        "id": a.id,
        "baseModel": a.base,
        "state": state,
        "rank": a.rank,
        "memoryMB": a.size_mb,
        "sha256": a.sha256,
        "governed": a.governed,
        "error": record.error,
        "requests": {"running": record.running, "waiting": record.waiting},
    }


def _governed(doc: dict[str, Any], header_token: str | None) -> GovernedRequest:
    """The call as governance sees it: the adapter's id as `modelId`, the other fields
    (all but the token) as the params the signers approved."""
    fields = {k: v for k, v in doc.items() if k != "adapterId"}
    return governed_request({**fields, "modelId": doc["adapterId"]}, header_token)


def _text(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise BadRequest(f"{key} is required and must be a non-empty string")
    return value


def _sha(doc: dict[str, Any]) -> str:
    value = doc.get("sha256")
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _HEX:
        raise BadRequest("sha256 must be 64 lowercase hex characters")
    return value


def _digest_or_none(path: Path) -> str | None:
    try:
        return file_digest(path)
    except OSError:
        return None
